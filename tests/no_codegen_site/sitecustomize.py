"""Imported at the start of every Python process whose PYTHONPATH holds this folder (conftest.no_codegen_env): a
test's subprocesses, and the ranks they launch, compile as the in-process `no_codegen` fixture does (traced_only;
a cold code generation is most of such a test's time)."""

import torch
from traced_only import traced_only

torch.compile = traced_only(torch.compile)
