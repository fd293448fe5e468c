"""The planner's fitted constants, one row each: its value, its unit, and what it was fitted on.

A refit changes this file only (and a strategy's own facts, in its row of tunebench.strategies.STRATEGIES). The
formulas that read these rows are in plan.speed, plan.memory, plan.activations and plan.hardware; the records they
were fitted on are in tests/data/planner, the figures in benchmarks/results/planner.md. "The reference host" is the
machine whose host figures (hw.host's dispatch time) scale the host rows to another host (plan.hardware).
`rows()` lists the table (`tunebench plan --calibration` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def fitted(value: Any, unit: str, on: str) -> Any:
    """One row: the constant's value, its unit, and what it was fitted on."""
    return field(default_factory=lambda: value, metadata={"unit": unit, "fitted_on": on})


@dataclass(frozen=True)
class Calibration:
    # --- the hardware's ceilings when the store has no `tunebench hw` record of the GPU (plan.hardware)
    mamf_of_peak: float = fitted(0.80, "share of the dense bf16 peak", "MAMF in tunebench hw records")
    fp32_mamf_of_peak: float = fitted(0.76, "share of the CUDA cores' fp32 peak", "fp32 MAMF in hw records, TF32 off")
    copy_of_spec: float = fitted(0.81, "share of the spec's memory bandwidth", "device copy in tunebench hw records")
    busbw_of_link: float = fitted(0.78, "share of the GPU's link bandwidth", "all-reduce bus bandwidth in hw records")
    inter_node_gbps: float = fitted(25.0, "GB/s per GPU across nodes", "200 Gb/s NICs' line rate (not measured)")
    reference_host_dispatch_us: float = fitted(1648.0, "us (hw.host dispatch)", "the reference host")

    # --- GEMMs (plan.speed)
    gemm_peak_share: float = fitted(0.93, "share of the matmul ceiling", "wide models' GEMMs, profiled")
    gemm_floor_share: float = fitted(0.05, "share of the matmul ceiling", "a floor for very narrow models (not fitted)")
    adapter_matmul_share: float = fitted(0.06, "share of the matmul ceiling",
                                         "rank-r LoRA GEMMs (memory-bound), planner_terms.py's LoRA profiles")
    narrow_hidden: float = fitted(400, "hidden size", "GEMM efficiency against hidden size, GPT-2 small profiled")
    matmul_half_tokens: float = fitted(600, "tokens per micro-batch", "short micro-batches on every GPU record")
    fp32_matmul_half_work: float = fitted(2.4e5, "tokens x hidden", "fp32 GEMMs, profiled")
    tf32_of_bf16_efficiency: float = fitted(0.85, "share of bf16's curve", "TF32 GEMMs, profiled")
    head_align: int = fitted(64, "rows", "cuBLAS's aligned kernels (an unpadded GPT-2 head)")
    unaligned_head_slowdown: float = fitted(8.0, "x", "GPT-2 runs made before the loss padded its head")
    float8_gemm_speedup: dict = fitted({"off": 1.0, "tensorwise": 1.45, "rowwise": 1.3}, "x bf16's block GEMMs",
                                       "Llama-3-8B full FSDP2 runs")
    float8_frozen_speedup: float = fitted(1.43, "x bf16", "a frozen base's two products a layer, kernels_vs.py")
    grouped_half_rows: float = fitted(220, "rows per expert",
                                      "Qwen3-30B-A3B runs; Mixtral-8x7B QLoRA b8 checkpointed, profiled")
    grouped_gemm_per_group_s: float = fitted(0.7e-6, "s per expert and rank-r grouped GEMM",
                                             "Qwen3-30B-A3B expert-LoRA runs, profiled")

    # --- attention (plan.speed)
    attention_of_peak: float = fitted(0.568, "share of the dense peak at long sequences",
                                      "SDPA's causal kernel alone, 1k-128k tokens, head dim 128 "
                                      "(benchmarks/probes/attention_kernel.py); checked on planner_terms.py's profiles")
    attention_half_seq: float = fitted(820, "tokens", "the same kernel")
    attention_kernel_of_peak: float = fitted(0.54, "share of the dense peak the kernel never exceeds",
                                             "SDPA's causal kernel alone, 8k-128k tokens, grouped keys, H100 "
                                             "(benchmarks/probes/attention_kernel.py)")
    narrow_head_attention_share: float = fitted(0.85, "x the curve, heads narrower than 128",
                                                "GPT-2, Llama-3.2-1B (64) and Phi-3.5 (96) profiles, planner_terms.py")
    softcap_attention_slowdown: float = fitted(4.2, "x the curve", "Gemma-2-9B's FlexAttention, planner_terms.py")
    attention_dropout_slowdown: float = fitted(1.6, "x", "GPT-2 small s2048 with and without dropout, one job")
    fp32_attention_of_peak: float = fitted(0.64, "share of the fp32 peak", "SDPA's memory-efficient kernel, profiled")
    fp32_attention_half_seq: float = fitted(880, "tokens", "the same kernel at 1,024 and 2,048 tokens")
    fp32_attention_dropout_slowdown: float = fitted(1.15, "x", "GPT-2 small fp32 runs with dropout")

    # --- memory-bound kernels, the loss and the optimizer (plan.speed)
    elementwise_bytes: dict = fitted(
        {("gpt2", False): 8.6, ("gpt2", True): 2.05, ("llama", False): 8.8, ("llama", True): 2.5},
        "bytes moved per byte saved for backward, by (architecture, compiled)",
        "compiled: planner_terms.py's profiles (LoRA without checkpointing; GPT-2 full); eager: every GPU record")
    traced_recompute_fused: float = fitted(0.0, "share of a traced recompute's elementwise traffic saved",
                                           "Llama-3.1-8B, Qwen3-8B, Phi-3.5 checkpointed LoRA, profiled")
    experts_elementwise_share: float = fitted(2.0, "x a dense block's bytes",
                                              "kept where Qwen3-30B-A3B's and Mixtral's records fit (not profiled)")
    autocast_cast_bytes_per_param: float = fitted(6, "bytes per trained parameter and forward",
                                                  "fp32 read, bf16 written (not fitted)")
    autocast_grad_bytes_per_param: float = fitted(7, "bytes per trained parameter and micro-batch",
                                                  "Llama-3.2-1B full, profiled (planner_terms.py)")
    fp32_elementwise_bytes: dict = fitted(
        {("gpt2", False): 3.7, ("gpt2", True): 2.2, ("llama", False): 6.3, ("llama", True): 2.35},
        "bytes per saved byte in fp32", "GPT-2 small and Llama-3.2-1B fp32, profiled")
    loss_bytes_per_logit: float = fitted(9, "bytes per 16-bit logit", "the fused loss's compiled softmax")
    optimizer_bytes: dict = fitted({"adamw": 118, "adamw_fused": 77, "adamw_8bit": 50, "paged_adamw_8bit": 50},
                                   "bytes moved per trained parameter a step",
                                   "Llama-3.2-1B full runs (strategies may override: their rows)")
    host_adam_s_per_param: float = fitted(0.45e-9, "s per parameter, all of a node's cores",
                                          "one Llama-3-8B full ZeRO-3 offload run")
    offload_bytes_per_param: float = fitted(4, "bytes over PCIe per parameter", "bf16 gradient down, weight up")
    pcie_bytes_per_s: float = fitted(20e9, "bytes/s", "pinned copies on the reference host")
    activation_copy_bytes_per_s: float = fitted(20e9, "bytes/s one way", "offload=activations, Mistral-7B QLoRA")
    copies_exposed: float = fitted(0.4, "share of the copies' time not hidden", "the same runs")

    # --- the host (plan.speed; scaled by this host's dispatch time)
    host_per_adapter_s: float = fitted(0.5e-3, "s per adapted linear and pass, eager", "LoRA runs, reference host")
    host_per_compiled_block_s: float = fitted(2.5e-3, "s per block and micro-batch", "every GPU record")
    whole_graph_host_per_block_s: float = fitted(1.6e-3, "s per block and micro-batch", "GPT-2 small compiled whole")
    cuda_graph_host_per_block_s: float = fitted(0.6e-3, "s per block and micro-batch", "GPT-2 small replayed")
    deepspeed_per_micro_s: float = fitted(8e-3, "s per micro-batch", "DeepSpeed's engine hooks, ZeRO records")
    launch_gaps: float = fitted(0.1, "share of the shorter of GPU and host time", "eager records")
    launch_gaps_compiled: float = fitted(0.05, "share of the shorter of GPU and host time", "compiled records")

    # --- memory (plan.memory, plan.activations)
    context_bytes: dict = fitted({1: int(1.45 * 2**30), "nccl": int(2.1 * 2**30), "nccl-multi": int(2.4 * 2**30)},
                                 "bytes (NVML used - reserved)", "GPU runs: one process, NCCL, NCCL x N")
    reserve_floor_bytes: float = fitted(0.25 * 2**30, "bytes", "the allocator's smallest reserve seen")
    graph_reserve_bytes: float = fitted(0.75 * 2**30, "bytes", "CUDA-graph runs' reserved beyond allocated")
    traced_extra_blocks: float = fitted(1.25, "blocks of activations (LoRA, QLoRA)", "Mistral-7B LoRA and QLoRA runs")
    cuda_graph_pool_slack: float = fitted(0.15 * 2**30, "bytes", "GPT-2 small's CUDA graph pools")
    graph_pool_own_gradients: float = fitted(0.75, "share of the gradients", "Llama-3.2-1B and GPT-2 medium pools")


CAL = Calibration()


def rows(cal: Calibration = CAL) -> list[tuple[str, Any, str, str]]:
    """(name, value, unit, fitted on) of every constant."""
    return [(f.name, getattr(cal, f.name), f.metadata["unit"], f.metadata["fitted_on"]) for f in fields(cal)]
