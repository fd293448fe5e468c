"""Launching runs: in this process, or under torchrun (local GPUs, several nodes)."""
