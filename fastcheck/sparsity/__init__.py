"""f's traced sparsity pattern and its colouring, for coloured mode and the eager shortcuts."""
