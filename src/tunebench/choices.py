"""Every `auto` setting of a training run, chosen once: from its config, its strategy and the device it runs on.

The run (run_preflight, then runner and trainer), the planner (plan.workload) and tune read the config `resolve`
returns; the record keeps what was chosen (metrics.precision, compile_scope, cuda_graphs) and reports read it there.

  precision          bf16 on GPUs; fp32 on the CPU, where bf16 matmuls run several times slower than fp32's
  compile            on for GPU training: the whole model as one graph at any size, blocks compiled apart where a
                     block has enough work per micro-batch (below COMPILE_MIN_WORK the host's cost per compiled
                     call outweighs what it saves). Off on the CPU, where compiling outlasts a short run, and
                     under zero3, whose parameter fetches run inside every block (never measured compiled)
  compile_scope      the whole model and its loss as one graph for SFT full fine-tuning without checkpointing, float8
                     or offload under a strategy that can compile it whole (single, ddp); blocks otherwise: under
                     checkpointing one graph no longer holds memory to a block's input, a LoRA/QLoRA base's whole
                     graph keeps more memory than it saves time, float8 and offload were never measured so
  cuda_graphs        on where the whole model is one graph in one process (single) under the same rule as
                     compile_scope's: the passes replayed as CUDA graphs, one launch each
  traced checkpoint  a checkpointed block recomputed whole, compiled apart, has its checkpoint traced inside the
                     compiled block (ckpt_traced), so backward's graph fuses the recompute; not where parameters are
                     gathered inside each module's forward (zero3), nor around a chunked MLP (mlp_chunk), which runs
                     outside the graph

Figures behind these rules: benchmarks/results/full-finetune.md and qlora-lora.md.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from tunebench.config import RunConfig
from tunebench.errors import UserError

Scope = Literal["blocks", "model"]

# tokens x parameters of one block, per micro-batch: below this a block compiled apart costs more on the host (its
# guards, the autograd wrapper and its kernels' launches, per block) than its fused kernels save on the GPU
COMPILE_MIN_WORK = 5e10


class Compiles(Protocol):
    """What a strategy (strategies.Strategy) says of compiling under it."""

    name: str
    one_process: bool  # exactly one process
    whole_compile: bool  # the model and its loss can be one graph
    gathers_per_module: bool  # parameters exist only inside their own module's forward (fetched there)


def precision_for(device_type: str) -> str:
    """precision=auto: bf16 on GPUs; fp32 on the CPU, where bf16 matmuls run several times slower than fp32's."""
    return "bf16" if device_type == "cuda" else "fp32"


def whole_model_by_default(cfg: RunConfig) -> bool:
    """compile_scope=auto (and cuda_graphs=auto) take the whole model as one graph for this workload."""
    # a preference loss takes a count of tokens known from the data only; a chunked MLP runs outside the graph
    return (cfg.method == "full" and not cfg.grad_ckpt and cfg.float8 == "off" and cfg.offload == "none"
            and cfg.objective == "sft" and not cfg.mlp_chunk)


def scope_if_compiled(cfg: RunConfig, strategy: Compiles) -> Scope:
    """What compiling `cfg` compiles (whether or not compile is on): the config's scope, or auto's."""
    if cfg.compile_scope != "auto":
        return cfg.compile_scope
    return "model" if strategy.whole_compile and whole_model_by_default(cfg) else "blocks"


def _compiles(cfg: RunConfig, strategy: Compiles, device_type: str, scope: Scope,
              block_params: int | None) -> bool:
    if cfg.compile != "auto":
        return cfg.compile
    if device_type != "cuda" or strategy.gathers_per_module:
        return False
    work = None if block_params is None else cfg.batch_size * cfg.seq_len * block_params
    return scope == "model" or work is None or work >= COMPILE_MIN_WORK


def resolve(cfg: RunConfig, strategy: Compiles, device_type: str, block_params: int | None = None) -> RunConfig:
    """`cfg` with every 'auto' made concrete for `device_type` ("cuda" or "cpu"): precision, compile (a bool),
    compile_scope ("blocks" or "model" where compiled), cuda_graphs (a bool). `block_params`: the parameters of one
    transformer block, when known. (cuda_graphs=true where no whole-model graph runs is refused with the strategy's
    checks: check_cuda_graphs.)"""
    scope = scope_if_compiled(cfg, strategy)
    update: dict[str, Any] = {}
    if cfg.precision == "auto":
        update["precision"] = precision_for(device_type)
    compiled = _compiles(cfg, strategy, device_type, scope, block_params)
    if cfg.compile == "auto":
        update["compile"] = compiled
    if compiled and cfg.compile_scope == "auto":
        update["compile_scope"] = scope
    if cfg.cuda_graphs == "auto":
        update["cuda_graphs"] = (device_type == "cuda" and compiled and scope == "model" and strategy.one_process
                                 and whole_model_by_default(cfg))
    return cfg.model_copy(update=update) if update else cfg


def compile_scope(cfg: RunConfig, strategy: Compiles) -> Scope | None:
    """What a resolved config compiles: None (eager), "blocks" or "model"."""
    return scope_if_compiled(cfg, strategy) if cfg.compile is True else None


def traces_whole_checkpoint(cfg: RunConfig, strategy: Compiles) -> bool:
    """A resolved config's blocks recomputed whole get their checkpoint traced inside the compiled block."""
    return (cfg.grad_ckpt and cfg.ckpt_traced and compile_scope(cfg, strategy) == "blocks"
            and not strategy.gathers_per_module and not cfg.mlp_chunk)


def reference_in_policy_graph(cfg: RunConfig, strategy: Compiles) -> bool:
    """A resolved DPO config's reference runs the policy's compiled forward, in its grad and train mode with nothing
    saved: LoRA or QLoRA with compiled blocks, the adapters scaled by zero (methods.adapter_gate) rather than peft's
    adapters disabled; a full fine-tune's frozen copy (or, precomputing, the model itself), its blocks prepared and
    sharded as the policy's (not under ZeRO-3, whose copy is never built)."""
    if cfg.objective != "dpo" or compile_scope(cfg, strategy) != "blocks":
        return False
    return cfg.method != "full" or not strategy.gathers_per_module


def check_cuda_graphs(cfg: RunConfig, strategy: Compiles) -> None:
    """cuda_graphs=true replays one graph of the whole model in one process: nothing else was built (per-block graphs
    measured no faster; under DDP its hooks run between the graph's pieces)."""
    why = None
    if not strategy.one_process:
        why = f"with strategy={strategy.name}: CUDA graphs replay the whole model's graph in one process (single)"
    elif cfg.compile is False:
        why = "with compile=false: CUDA graphs replay the compiled graph (use compile on or auto)"
    elif scope_if_compiled(cfg, strategy) != "model":
        why = (f"with compile_scope={cfg.compile_scope}: CUDA graphs replay the whole model as one graph (use "
               "compile_scope=model)")
    elif cfg.offload != "none":
        why = f"with offload={cfg.offload}: its copies to host memory run from Python, between the kernels"
    if why:
        raise UserError(f"invalid cuda_graphs=true {why}")
