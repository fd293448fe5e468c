"""Every config key under one topic: how `--help` groups the flags and docs/configuration.md its tables."""

from __future__ import annotations

from pydantic import BaseModel

TOPICS: dict[str, tuple[str, ...]] = {
    "model and method": ("model", "method", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_fused",
                         "quant", "double_quant", "quant_compute_dtype", "dropout", "objective", "beta",
                         "label_smoothing", "dpo_loss", "simpo_gamma", "precompute_reference"),
    "batch, steps and optimizer": ("batch_size", "grad_accum", "seq_len", "steps", "warmup", "optimizer", "lr",
                                   "weight_decay", "grad_clip", "seed"),
    "precision and kernels": ("precision", "tf32", "float8", "attn", "attn_kernel"),
    "memory": ("grad_ckpt", "ckpt_every", "ckpt_keep", "ckpt_keep_every", "ckpt_traced", "offload", "mlp_chunk"),
    "compile": ("compile", "compile_scope", "cuda_graphs"),
    "several GPUs and nodes": ("strategy", "nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id",
                               "shard_size", "timeout"),
    "the run": ("device", "run_timeout", "tag", "telemetry", "max_step_s", "fault"),
    # tunebench train
    "data": ("data", "data_format", "text_field", "prompt_field", "completion_field", "messages_field", "chosen_field",
             "rejected_field", "train_on_prompt", "strict_data", "max_bad_rows", "packing", "eval_data",
             "eval_fraction", "tokenizer"),
    "schedule and evaluation": ("epochs", "max_steps", "schedule", "warmup_steps", "eval_every", "eval_batches",
                                "target_eval_loss", "eval_tasks", "eval_limit"),
    "outputs": ("output_dir", "log_every", "save_every", "keep_checkpoints", "resume", "overwrite", "merge",
                "merge_dtype", "track"),
    # tunebench eval
    "evaluation": ("tasks", "limit", "num_fewshot", "apply_chat_template", "base", "download"),
    # tunebench hw, load, infer
    "measurement": ("quick", "sections", "dtypes", "nproc", "min_size", "max_size", "iters", "precisions", "cache",
                    "workdir", "batch_sizes", "prompt_len", "new_tokens", "kv_cache", "repeats"),
}


def topics_of(cls: type[BaseModel]) -> dict[str, list[str]]:
    """The topics of `cls`'s fields in TOPICS' order, each with its fields in the class's order."""
    where = {name: topic for topic, names in TOPICS.items() for name in names}
    missing = [n for n in cls.model_fields if n not in where]
    if missing:
        raise KeyError(f"config keys without a topic in config/topics.py: {', '.join(missing)}")
    out: dict[str, list[str]] = {t: [] for t in TOPICS}
    for name in cls.model_fields:
        out[where[name]].append(name)
    return {t: names for t, names in out.items() if names}
