"""RunConfig: one training benchmark. Field names are the YAML keys; CLI flags are the same with dashes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunebench.config.base import LATER, LAUNCH, MEASUREMENT, config_hash, identity

Method = Literal["full", "lora", "qlora"]
Precision = Literal["auto", "bf16", "bf16-pure", "fp16", "fp32"]
Optimizer = Literal["adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit"]
Strategy = Literal["single", "ddp", "fsdp", "zero2", "zero3"]  # tunebench.strategies registers each
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")
# Far beyond any real run, and small enough that nothing downstream overflows or preallocates absurdly.
MAX_BATCH, MAX_SEQ, MAX_STEPS, MAX_TOKENS_PER_STEP = 2**16, 2**21, 10**9, 2**31


class RunConfig(BaseModel):
    """One training benchmark. Field names are the YAML keys; CLI flags are the same with dashes."""

    # inf and NaN are refused for every float (a learning rate of inf is no configuration)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    model: str = Field("tiny-llama", description="preset name or local Hugging Face model directory")
    method: Method = "full"
    lora_rank: int = Field(16, gt=0, le=MAX_BATCH)
    lora_alpha: float = Field(32.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_targets: list[str] = Field(default_factory=lambda: ["all-linear"])
    lora_fused: bool = Field(True, description="LoRA layers reading one input (q/k/v, gate/up) run as one: their "
                                               "A matrices stacked into one matmul, each B product added in a "
                                               "matmul's epilogue (needs lora_dropout 0; where compile traces a "
                                               "checkpoint and under zero3 they run apart)",
                             json_schema_extra=LATER)
    quant: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    quant_compute_dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    precision: Precision = Field("auto", description="auto: bf16 on GPUs, fp32 on the CPU (where bf16 is slow); bf16: "
                                                    "fp32 weights, bf16 autocast; bf16-pure: weights, gradients and "
                                                    "optimizer state stored in bf16, no autocast (half the memory of "
                                                    "the model states; small updates round away)")
    tf32: bool = Field(False, description="with precision fp32 on a GPU (compute capability 8.0+): fp32 matmuls on the "
                                          "tensor cores in TF32 (inputs rounded to a 10-bit mantissa, fp32 sums), "
                                          "PyTorch's default being exact fp32 on the CUDA cores; an H100 measured 404 "
                                          "against 51 TFLOP/s", json_schema_extra=LATER)
    batch_size: int = Field(1, gt=0, le=MAX_BATCH, description="micro-batch per device")
    grad_accum: int = Field(1, gt=0, le=MAX_BATCH)
    seq_len: int = Field(512, gt=0, le=MAX_SEQ)
    steps: int = Field(20, gt=0, le=MAX_STEPS, description="optimizer steps in total, warmup included",
                       json_schema_extra=MEASUREMENT)
    warmup: int = Field(10, ge=0, description="steps run first and never timed", json_schema_extra=MEASUREMENT)
    optimizer: Optimizer = Field(
        "adamw_fused", description="adamw_fused: torch's AdamW in one kernel per step (on an H200, Llama-3.2-1B full "
                                   "8-18% faster than adamw, torch's foreach AdamW, and 3.5 GiB lighter with "
                                   "checkpointing; GPT-2 small alike); adamw_8bit and paged_adamw_8bit: bitsandbytes'")
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="max grad norm; 0 disables clipping")
    grad_ckpt: bool = Field(False, description="activation checkpointing: blocks keep only their input and run "
                                               "their forward again in backward")
    ckpt_every: int = Field(1, ge=1, le=1024, description="with grad_ckpt: checkpoint one block in N (1: every "
                                                          "block, full; 2: every other block, selective)",
                            json_schema_extra=LATER)
    ckpt_keep: Literal["input", "matmuls"] = Field(
        "input", description="with grad_ckpt: what a checkpointed block keeps. input: only its input (its whole "
                             "forward runs again in backward); matmuls: also the outputs of its large matmuls and "
                             "attention (op-level selective: only the elementwise ops run again)",
        json_schema_extra=LATER)
    ckpt_keep_every: int = Field(
        1, ge=1, le=1024, description="with ckpt_keep=matmuls: one checkpointed block in N keeps its matmuls' "
                                      "outputs, the others only their input (a dial between the two: Mistral-7B "
                                      "QLoRA keeps ~0.34 GiB more per such block and runs its backward ~30% faster)",
        json_schema_extra=LATER)
    ckpt_traced: bool = Field(
        True, description="with grad_ckpt and compile per block: a block recomputed whole has its checkpoint inside "
                          "the compiled block, traced (its forward saves only the input; backward's graph holds the "
                          "recompute, fused with backward's own ops); false: Hugging Face's checkpoint around the "
                          "block's call, the compiled forward run twice as it is (what records stored before this "
                          "field ran)",
        json_schema_extra=LATER)
    dropout: float | None = Field(
        None, ge=0, lt=1, description="every dropout probability of the model set to this (GPT-2's resid/embd/attn "
                                      "pdrop, Llama's attention_dropout); unset: the model's own (GPT-2 0.1, Llama "
                                      "0). 0 is how nanoGPT and llm.c pretrain GPT-2",
        json_schema_extra=LATER)
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    attn_kernel: Literal["auto", "flash", "cudnn", "efficient"] = Field(
        "auto", description="with attn=sdpa, training: the kernel SDPA tries first (it falls back to the next one "
                            "that takes the inputs). auto: PyTorch's own order (flash first). cudnn: 1.45x flash's "
                            "forward + backward alone on an H200, no faster in whole steps measured there (GPT-2 "
                            "small, Mistral-7B QLoRA)",
        json_schema_extra=LATER)
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the model (compile time is reported apart, never in the timed steps); "
                            "auto: on for GPU training with enough work per block, off on the CPU and under zero3 "
                            "(see compile_for)")
    compile_scope: Literal["auto", "blocks", "model"] = Field(
        "auto", description="with compile: blocks (each block its own graph; every strategy) or model (the whole "
                            "model and its loss as one graph; strategies single and ddp; on an H200 GPT-2 full "
                            "1.06-1.15x blocks across jobs); auto: model for full fine-tuning without "
                            "checkpointing under single or ddp (float8 and offload off), blocks otherwise",
        json_schema_extra=LATER)
    cuda_graphs: bool | Literal["auto"] = Field(
        "auto", description="with the whole model compiled as one graph in one process on a GPU (compile_scope "
                            "model, strategy single): its forward and backward replayed as CUDA graphs "
                            "(torch.compile's reduce-overhead mode), one launch a pass where the host launched "
                            "every kernel; gradients accumulated in place over micro-batches. auto: on there for full "
                            "fine-tuning without checkpointing, float8 or offload (where it was measured: GPT-2 small "
                            "on an H100 2.53x at s1024 b1, 2.94x at s512 b4 x 4 micro-batches, 1.01-1.11x at 8,192+ "
                            "tokens; Llama-3.2-1B 1.02x; the same losses; their pools cost 0.04-0.3 GiB), off "
                            "elsewhere",
        json_schema_extra=LATER)
    float8: Literal["off", "tensorwise", "rowwise"] = Field(
        "off", description="full fine-tuning: the blocks' linear layers compute in float8 through torchao (GPUs of "
                           "compute capability 8.9+; master weights and optimizer state unchanged); tensorwise: one "
                           "scale per tensor (float8 all-gather under fsdp), rowwise: one per row. LoRA/QLoRA "
                           "(rowwise, single or ddp): the frozen base's two matmuls a layer in float8, the adapters "
                           "in bf16",
        json_schema_extra=LATER)
    offload: Literal["none", "optimizer", "activations"] = Field(
        "none", description="optimizer (zero2/zero3): the fp32 master weights and Adam's state live in host memory "
                            "and DeepSpeed's CPU Adam steps them there (GPUs keep the 16-bit weights and gradients); "
                            "activations (single/ddp): what the forward saves for backward (with grad_ckpt, each "
                            "block's input) waits in pinned host memory, copied both ways beside the compute",
        json_schema_extra=LATER)
    shard_size: int | None = Field(
        None, gt=0, le=1 << 20, description="fsdp: how many processes share one copy of the model states (None: "
                                            "all of them). Smaller, the processes form groups of this size that "
                                            "replicate each other (HSDP): with the processes per node, the weights "
                                            "are gathered within a node and only gradients cross nodes",
        json_schema_extra=LATER)
    seed: int = Field(0, json_schema_extra=MEASUREMENT)
    device: Literal["auto", "cuda", "cpu"] = Field("auto", json_schema_extra=MEASUREMENT)
    strategy: Strategy = "single"
    nproc_per_node: int | None = Field(None, gt=0, le=1024, description="processes per node (default: all visible "
                                                                        "GPUs; 1 on CPU)")
    nnodes: int = Field(1, gt=0, le=100_000)
    node_rank: int = Field(0, ge=0, json_schema_extra=LAUNCH)
    rdzv_endpoint: str | None = Field(None, description="HOST:PORT of the c10d rendezvous (multi-node)",
                                      json_schema_extra=LAUNCH)
    rdzv_id: str | None = Field(None, description="rendezvous id shared by all nodes (default from the config)",
                                json_schema_extra=LAUNCH)
    timeout: float = Field(600.0, gt=0, description="collective timeout in seconds: a dead or stuck rank fails "
                                                    "the run after this", json_schema_extra=LAUNCH)
    run_timeout: float | None = Field(None, gt=0, description="wall-clock limit in seconds for the whole run (every "
                                                              "rank); then status timeout", json_schema_extra=LAUNCH)
    tag: list[str] = Field(default_factory=list, description="free-text labels stored with the record",
                           json_schema_extra=LAUNCH)
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) over the "
                                              "timed steps on GPUs", json_schema_extra=LAUNCH)
    max_step_s: float | None = Field(None, gt=0, description="end the timed region after 3 steps when they take "
                                                             "longer than this on average (tune drops clearly "
                                                             "slower candidates)",
                                      json_schema_extra=MEASUREMENT | LATER)
    fault: str | None = Field(None, pattern=r"^(abort|hang|raise)@\d+$",
                              description="testing the harness only: abort@STEP, hang@STEP or raise@STEP")

    @field_validator("lora_targets", "tag", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("lora_targets")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if not v or any(not t.strip() or t != t.strip() for t in v):
            raise ValueError("every target must be a module name such as q_proj (or all-linear)")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.steps <= self.warmup:
            raise ValueError(f"steps={self.steps} must be greater than warmup={self.warmup} "
                             "(warmup steps are not timed)")
        if self.ckpt_keep != "input" and not self.grad_ckpt:
            raise ValueError(f"ckpt_keep={self.ckpt_keep} chooses what checkpointed blocks keep: it needs grad_ckpt")
        if not self.ckpt_traced and not self.grad_ckpt:
            raise ValueError("ckpt_traced=false chooses where a checkpoint goes: it needs grad_ckpt")
        if self.ckpt_keep_every != 1 and self.ckpt_keep != "matmuls":
            raise ValueError(f"ckpt_keep_every={self.ckpt_keep_every} chooses which checkpointed blocks keep their "
                             "matmuls: it needs ckpt_keep=matmuls")
        if self.tf32 and self.precision != "fp32":  # auto too: it computes in bf16 on GPUs
            raise ValueError(f"tf32 chooses how fp32 matmuls run: it needs precision=fp32 (precision={self.precision} "
                             "computes in 16 bits on GPUs)")
        return self._check_shape_and_nodes()

    def _check_shape_and_nodes(self) -> RunConfig:
        if self.batch_size * self.seq_len * self.grad_accum > MAX_TOKENS_PER_STEP:
            raise ValueError(f"batch_size x seq_len x grad_accum = {self.batch_size * self.seq_len * self.grad_accum:,}"
                             f" tokens per step is above the limit of {MAX_TOKENS_PER_STEP:,}")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be below nnodes={self.nnodes}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"nnodes={self.nnodes} needs rdzv_endpoint=HOST:PORT (the rendezvous on the first node)")
        if self.rdzv_endpoint and not _is_endpoint(self.rdzv_endpoint):
            raise ValueError(f"rdzv_endpoint={self.rdzv_endpoint} must be HOST:PORT")
        return self

    @property
    def distributed(self) -> bool:
        """Runs under torchrun: any strategy but single, or more than one process."""
        return self.strategy != "single" or (self.nproc_per_node or 1) > 1 or self.nnodes > 1

    @property
    def frozen_float8(self) -> bool:
        """A LoRA/QLoRA base computing in float8 (models.float8_frozen), not torchao's full fine-tuning float8."""
        return self.float8 != "off" and self.method != "full"

    def resolved(self, device_type: str, block_params: int | None = None, whole_model: bool = False) -> RunConfig:
        """A copy with 'auto' choices made for the device: precision bf16 on GPUs, fp32 on the CPU; compile
        as `compile_for` says (`block_params`: parameters of one transformer block, when known; `whole_model`:
        compiling would compile the whole model as one graph, as the strategy's compile scope says)."""
        update: dict[str, Any] = {}
        if self.precision == "auto":
            update["precision"] = "bf16" if device_type == "cuda" else "fp32"
        if self.compile == "auto":
            work = None if block_params is None else self.batch_size * self.seq_len * block_params
            update["compile"] = compile_for(self.strategy, device_type, work, whole_model)
        if self.cuda_graphs == "auto":
            compiled = update.get("compile", self.compile) is True
            update["cuda_graphs"] = (device_type == "cuda" and compiled and whole_model and self.strategy == "single"
                                     and whole_model_by_default(self))
        return self.model_copy(update=update) if update else self

    def config_hash(self) -> str:
        """Identity of the workload (launch fields excluded), used to match results across sweeps."""
        return config_hash(identity(type(self), self.model_dump()))


def whole_model_by_default(cfg: RunConfig) -> bool:
    """compile_scope=auto compiles the whole model where that was measured faster at little cost in memory: full
    fine-tuning without checkpointing (on an H200, GPT-2 small whole 390,002 tokens/s at 8.51 GiB, 1.00x a plain
    torch.compile script; per block 340-368k at 7.83 GiB in other jobs; Llama-3.2-1B's and DDP's whole-model
    figures came from runs with a zero loss gradient, withdrawn, not re-measured). Per block elsewhere: under
    checkpointing one graph no longer holds to a block's input (Mistral-7B QLoRA 6.2 -> 15.7 GiB), a LoRA/QLoRA
    base's whole graph kept a third more memory for 6%, and float8 and offload were not measured so. CUDA graphs
    (cuda_graphs=auto) follow the same rule: measured only there."""
    return cfg.method == "full" and not cfg.grad_ckpt and cfg.float8 == "off" and cfg.offload == "none"


# tokens x parameters of one block, per micro-batch: below this a block compiled apart costs more on the host
# (guards, the autograd wrapper, per block) than it saves on the GPU. Measured on an H200: GPT-2 at 2048 tokens
# (1.4e10) ran 36-45% slower compiled per block under ddp and zero2; at 16384 tokens (1.2e11) 1.6x faster. The
# whole model as one graph pays that once per micro-batch: GPT-2 on one H200, whole against eager, 2.19x at s2048
# b1 (1.4e10), 1.38x at s1024 b4, 1.11x at s512 b4, and under ddp (one rank) 1.08x at s1024 b4, less memory in each.
COMPILE_MIN_WORK = 5e10


def compile_for(strategy: str, device_type: str, work_per_block: float | None = None,
                whole_model: bool = False) -> bool:
    """What compile=auto means. On GPUs compiled blocks measured faster wherever a block has enough work per
    micro-batch (GPT-2 full b8 1.6x, Mistral-7B QLoRA 1.27-1.35x, Llama-3-8B FSDP2 1.10x, under ddp, fsdp and
    zero2 too), and the whole model as one graph at any work measured. Off on the CPU, where compiling takes
    longer than a short run, under zero3, whose parameter-fetch hooks run inside every block (never measured), and
    for blocks compiled apart below COMPILE_MIN_WORK."""
    if device_type != "cuda" or strategy == "zero3":
        return False
    return whole_model or work_per_block is None or work_per_block >= COMPILE_MIN_WORK


def _is_endpoint(s: str) -> bool:
    host, _, port = s.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
