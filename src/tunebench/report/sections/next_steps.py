"""Next steps: after benchmarks alone (`tunebench quick`, a sweep), the commands that take the fastest
configuration through the rest of a job: train it on one's data, score it, export it."""

from __future__ import annotations

import shlex

from tunebench.config import TrainConfig
from tunebench.document import Section
from tunebench.report.context import ReportContext

SHOWN = ("model", "method", "strategy", "nproc_per_node", "batch_size", "seq_len", "grad_ckpt", "precision",
         "optimizer", "compile", "device")


def section(ctx: ReportContext) -> Section | None:
    benchmarks = [r for r in ctx.ok if r.metrics.job is None]
    if not benchmarks or any(r.metrics.job is not None for r in ctx.train) or ctx.kind("eval"):
        return None  # a report that already holds a job shows where that job went instead
    best = max(benchmarks, key=lambda r: r.metrics.tokens_per_s)
    flags = ["--model", str(best.config.get("model"))]
    for key in SHOWN[1:]:
        value, default = best.config.get(key), TrainConfig.model_fields[key].default
        if value is None or value == default:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    merge = ["--merge"] if best.config.get("method") != "full" else []  # an adapter's job: the merged model too
    train = " ".join(["tunebench train", *map(shlex.quote, flags), "--data", "YOUR.jsonl", "--output-dir",
                      "runs/job", "--eval-tasks", "TASKS", *merge])
    return Section("Next steps", [
        "The fastest configuration here, trained on your data (a local model folder as `--model` and its tokenizer; "
        "`--eval-tasks` scores the trained model and its base with lm-evaluation-harness at the end):",
        f"`{train}`",
        "Then `tunebench eval runs/job --tasks TASKS` scores it again on other tasks, `tunebench export runs/job "
        "--format gguf` writes it for llama.cpp, Ollama or LM Studio, and `tunebench report` shows the job beside "
        "these runs."])
