"""torch.compile as a compiled run traces, partitions and recomputes, without inductor's code generation
(`aot_eager_decomp_partition`: inductor's decompositions and min-cut partitioner, the graphs run eagerly)."""


def traced_only(compile):
    """`compile` (torch.compile) with that backend unless one is asked for."""

    def wrapped(model=None, **kw):
        kw.setdefault("backend", "aot_eager_decomp_partition")
        return compile(**kw) if model is None else compile(model, **kw)

    return wrapped
