"""The rule and its stages: one pair's verdict from its numbers, refinement, wide and flat steps, the block stages."""
