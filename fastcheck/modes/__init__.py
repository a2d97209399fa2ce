"""The directions each mode evaluates: full Jacobian columns, coloured sums, fast mode's random probes."""
