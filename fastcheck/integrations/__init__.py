"""fastcheck beside other tools: the compute_gradient drop-in, the CLI and demo, the pytest observers."""
