"""The training loop (accelerate), checkpoints and run directories."""
