"""Units used across tunebench: binary sizes for memory, decimal for bandwidth and FLOP/s."""

KIB = 2**10
MIB = 2**20
GIB = 2**30
