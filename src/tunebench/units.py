"""Units used across tunebench: binary sizes for memory, decimal for bandwidth and FLOP/s."""

GIB = 2**30
