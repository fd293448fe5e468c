"""Measurements: step timing, statistics, FLOPs/MFU, memory."""
