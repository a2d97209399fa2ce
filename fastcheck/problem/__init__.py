"""What is checked: f's inputs and structures, Keras models, their float64 copies, variables as inputs."""
