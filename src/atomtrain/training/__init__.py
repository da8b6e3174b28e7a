"""The one training loop, losses, metrics, checkpoints and run outputs."""
