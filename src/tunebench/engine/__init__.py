"""The training engine: synthetic data, optimizer, loss and the timed loop."""
