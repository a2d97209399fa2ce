"""How f is evaluated: options and tunables, the plan of f's facts, precision, the batched and eager paths, VJPs."""
