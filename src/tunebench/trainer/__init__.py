"""A training job on one rank: the benchmark's engine (runner.build_trainable, engine.loop) fed from a
dataset, with a learning-rate schedule, evaluation, checkpoints, signals, logs and tracking (hooks.py),
and the trained adapter or model written out at the end (export.py)."""
