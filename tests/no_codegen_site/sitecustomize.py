"""Imported at the start of every Python process whose PYTHONPATH holds this folder (conftest.no_codegen_env): a
test's subprocesses, and the ranks they launch, compile as the in-process `no_codegen` fixture does, tracing and
partitioning as inductor would without its code generation (a cold code generation is most of such a test's time)."""

import torch

_compile = torch.compile


def _traced_only(model=None, **kw):
    kw.setdefault("backend", "aot_eager_decomp_partition")
    return _compile(**kw) if model is None else _compile(model, **kw)


torch.compile = _traced_only
