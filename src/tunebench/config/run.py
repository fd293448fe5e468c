"""RunConfig: one training benchmark. Field names are the YAML keys; CLI flags are the same with dashes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunebench.config.base import LATER, LAUNCH, MAX_SEED, MEASUREMENT, config_hash, identity

Method = Literal["full", "lora", "qlora"]
Precision = Literal["auto", "bf16", "bf16-pure", "fp16", "fp32"]
Optimizer = Literal["adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit"]
Strategy = Literal["single", "ddp", "fsdp", "zero2", "zero3"]  # tunebench.strategies registers each
Objective = Literal["sft", "dpo", "simpo", "orpo"]  # tunebench.engine.preference computes each but sft
PREFERENCE_KEYS = {"beta": ("dpo", "simpo", "orpo"), "label_smoothing": ("dpo", "simpo"), "dpo_loss": ("dpo",),
                   "simpo_gamma": ("simpo",), "precompute_reference": ("dpo",)}  # the objectives each key is for
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")
# their step over adapters gathers them into buffers of at most this many elements (engine.optim; plan.memory counts
# one buffer's copies)
PACKED_ELEMENTS = 1 << 28
# Far beyond any real run, and small enough that nothing downstream overflows or preallocates absurdly.
MAX_BATCH, MAX_SEQ, MAX_STEPS, MAX_TOKENS_PER_STEP = 2**16, 2**21, 10**9, 2**31


class RunConfig(BaseModel):
    """One training benchmark. Field names are the YAML keys; CLI flags are the same with dashes."""

    # inf and NaN are refused for every float (a learning rate of inf is no configuration)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    model: str = Field("tiny-llama", description="a preset (public shapes, random weights) or a local Hugging Face "
                                                 "model directory; docs/models.md lists them")
    method: Method = Field("full", description="full fine-tuning, LoRA, or QLoRA (LoRA on a 4-bit base)")
    lora_rank: int = Field(16, gt=0, le=MAX_BATCH, description="LoRA rank r")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA scaling alpha (updates scaled by alpha / r)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input")
    lora_targets: list[str] = Field(default_factory=lambda: ["all-linear"],
                                    description="modules to adapt: all-linear (peft's), module names such as q_proj "
                                                "(several: q_proj,v_proj), or experts (a mixture of experts' expert "
                                                "weights)")
    lora_fused: bool = Field(True, description="LoRA layers reading one input (q/k/v, gate/up) run as one: their A "
                                               "matrices stacked, their B products added in one epilogue",
                             json_schema_extra=LATER)
    quant: Literal["nf4", "fp4"] = Field("nf4", description="QLoRA's 4-bit data type")
    double_quant: bool = Field(True, description="QLoRA: quantize the quantization constants too")
    quant_compute_dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="QLoRA: the dtype 4-bit weights are dequantized to (auto: the precision's)")
    precision: Precision = Field("auto", description="auto: bf16 on GPUs, fp32 on the CPU; bf16: fp32 weights under "
                                                    "bf16 autocast; bf16-pure: weights, gradients and optimizer "
                                                    "state in bf16, no autocast")
    tf32: bool = Field(False, description="with precision fp32 on a GPU of compute capability 8.0+: matmuls on the "
                                          "tensor cores in TF32 instead of exact fp32", json_schema_extra=LATER)
    batch_size: int = Field(1, gt=0, le=MAX_BATCH, description="micro-batch per device")
    grad_accum: int = Field(1, gt=0, le=MAX_BATCH, description="micro-batches accumulated per optimizer step")
    seq_len: int = Field(512, gt=0, le=MAX_SEQ, description="tokens per sequence")
    steps: int = Field(20, gt=0, le=MAX_STEPS, description="optimizer steps in total, warmup included",
                       json_schema_extra=MEASUREMENT)
    warmup: int = Field(10, ge=0, description="first steps, never timed", json_schema_extra=MEASUREMENT)
    optimizer: Optimizer = Field("adamw_fused", description="adamw_fused: torch's AdamW in one kernel; adamw: its "
                                                            "foreach form; adamw_8bit, paged_adamw_8bit: bitsandbytes'")
    lr: float = Field(2e-4, gt=0, description="learning rate")
    weight_decay: float = Field(0.0, ge=0,
                                description="AdamW's decoupled weight decay (not on biases, norms, embeddings)")
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm; 0 disables clipping")
    grad_ckpt: bool = Field(False, description="activation checkpointing: blocks keep only their input and run "
                                               "their forward again in backward")
    ckpt_every: int = Field(1, ge=1, le=1024, description="with grad_ckpt: checkpoint one block in N",
                            json_schema_extra=LATER)
    ckpt_keep: Literal["input", "matmuls"] = Field(
        "input", description="with grad_ckpt, what a checkpointed block keeps: its input, or also its large matmuls' "
                             "and attention's outputs (only elementwise ops run again)", json_schema_extra=LATER)
    ckpt_keep_every: int = Field(
        1, ge=1, le=1024, description="with ckpt_keep matmuls: one checkpointed block in N keeps them, the others "
                                      "only their input", json_schema_extra=LATER)
    ckpt_traced: bool = Field(
        True, description="with grad_ckpt and blocks compiled: a whole block's checkpoint traced inside the "
                          "compiled block (false: Hugging Face's, around it)",
        json_schema_extra=LATER)
    mlp_chunk: int | None = Field(
        None, gt=0, description="each MLP on N tokens at a time, keeping its input only",
        json_schema_extra=LATER)
    dropout: float | None = Field(
        None, ge=0, lt=1, description="every dropout probability of the model set to this (unset: the model's own)",
        json_schema_extra=LATER)
    attn: Literal["sdpa", "eager", "flash"] = Field("sdpa", description="attention implementation (flash needs the "
                                                                        "flash_attn package)")
    attn_kernel: Literal["auto", "flash", "cudnn", "efficient"] = Field(
        "auto", description="with attn sdpa, training: the kernel SDPA tries first (auto: PyTorch's order)",
        json_schema_extra=LATER)
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile (its time is reported apart); auto: on for GPU training where a block has "
                            "enough work, off on the CPU and under zero3 (tunebench.choices)")
    compile_scope: Literal["auto", "blocks", "model"] = Field(
        "auto", description="compile each block apart, or the whole model and its loss as one graph (single, ddp); "
                            "auto: model for full fine-tuning without checkpointing, float8 or offload",
        json_schema_extra=LATER)
    cuda_graphs: bool | Literal["auto"] = Field(
        "auto", description="replay the whole compiled model's passes as CUDA graphs (strategy single); auto: on "
                            "where compile_scope auto means model", json_schema_extra=LATER)
    float8: Literal["off", "tensorwise", "rowwise"] = Field(
        "off", description="float8 matmuls (compute capability 8.9+): full fine-tuning's block linears through "
                           "torchao; LoRA/QLoRA (rowwise): the frozen base's", json_schema_extra=LATER)
    offload: Literal["none", "optimizer", "activations"] = Field(
        "none", description="optimizer (zero2, zero3): master weights and Adam on the host; activations (single, "
                            "ddp): saved activations in pinned host memory", json_schema_extra=LATER)
    shard_size: int | None = Field(
        None, gt=0, le=1 << 20, description="fsdp: processes sharing one copy of the model states (unset: all); "
                                            "smaller groups replicate each other (HSDP)", json_schema_extra=LATER)
    objective: Objective = Field("sft", description="sft (next-token loss), or on preference pairs: dpo, simpo, orpo",
                                 json_schema_extra=LATER)
    beta: float = Field(0.1, gt=0, description="dpo, simpo, orpo: the preference term's strength",
                        json_schema_extra=LATER)
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="dpo, simpo: the share of pairs taken as mislabelled",
                                   json_schema_extra=LATER)
    dpo_loss: Literal["sigmoid", "ipo"] = Field("sigmoid", description="dpo: sigmoid, or IPO's squared loss",
                                                json_schema_extra=LATER)
    simpo_gamma: float = Field(0.5, ge=0, description="simpo: the target reward margin (`gamma` names it too)",
                               json_schema_extra=LATER)
    precompute_reference: bool = Field(False, description="dpo: the reference's log-probabilities computed before "
                                                          "training", json_schema_extra=LATER)
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the weights, the adapters and the data",
                      json_schema_extra=MEASUREMENT)
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: a GPU where there is one",
                                                   json_schema_extra=MEASUREMENT)
    strategy: Strategy = Field("single", description="one process, or DDP, FSDP2, DeepSpeed ZeRO-2 or ZeRO-3 "
                                                     "(docs/distributed.md)")
    nproc_per_node: int | None = Field(None, gt=0, le=1024, description="processes per node (unset: every visible "
                                                                        "GPU; 1 on the CPU)")
    nnodes: int = Field(1, gt=0, le=100_000, description="nodes; each runs the same command with its node_rank")
    node_rank: int = Field(0, ge=0, description="this node's rank", json_schema_extra=LAUNCH)
    rdzv_endpoint: str | None = Field(None, description="HOST:PORT of the c10d rendezvous (several nodes)",
                                      json_schema_extra=LAUNCH)
    rdzv_id: str | None = Field(None, description="rendezvous id shared by all nodes (unset: from the config)",
                                json_schema_extra=LAUNCH)
    timeout: float = Field(600.0, gt=0, description="seconds a distributed run's rank may wait in a collective or "
                                                    "go without a step; then every rank ends", json_schema_extra=LAUNCH)
    run_timeout: float | None = Field(None, gt=0, description="wall-clock limit of the whole run in seconds, every "
                                                              "rank; then status timeout", json_schema_extra=LAUNCH)
    tag: list[str] = Field(default_factory=list, description="free-text labels stored with the record",
                           json_schema_extra=LAUNCH)
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) over the timed "
                                              "steps on GPUs", json_schema_extra=LAUNCH)
    max_step_s: float | None = Field(None, gt=0, description="end the timed region after 3 steps slower than this "
                                                             "on average (tune's cut)",
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
        v = [t for item in v for t in item.split(",")]  # q_proj,v_proj as well as one name per item (no name has one)
        if not v or any(not t.strip() or t != t.strip() for t in v):
            raise ValueError("every target must be a module name such as q_proj (or all-linear)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _gamma(cls, data: Any) -> Any:
        """`gamma`, SimPO's name for its margin, is `simpo_gamma` (TRL's name, and this config's)."""
        if not isinstance(data, dict) or data.get("gamma") is None:
            return data
        gamma, rest = data["gamma"], {k: v for k, v in data.items() if k != "gamma"}
        if rest.get("simpo_gamma") is not None and rest["simpo_gamma"] != gamma:
            raise ValueError(f"gamma={gamma} and simpo_gamma={rest['simpo_gamma']} are one setting (SimPO's margin): "
                             "give one")
        return rest | {"simpo_gamma": gamma}

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
        if self.mlp_chunk and self.ckpt_keep == "matmuls":
            raise ValueError(f"mlp_chunk={self.mlp_chunk} with ckpt_keep=matmuls: the MLP's matmul outputs would be "
                             "kept, which mlp_chunk exists not to keep (use ckpt_keep=input)")
        if self.mlp_chunk and self.compile_scope == "model":
            raise ValueError(f"mlp_chunk={self.mlp_chunk} with compile_scope=model: the chunked MLP runs outside "
                             "the compiled graph (its backward calls autograd); use compile_scope=blocks")
        self._check_objective()
        return self._check_shape_and_nodes()

    def _check_objective(self) -> None:
        """An objective's own key set for another objective is a mistake, not a no-op (beta under sft)."""
        for key, objectives in PREFERENCE_KEYS.items():
            if self.objective not in objectives and getattr(self, key) != type(self).model_fields[key].default:
                raise ValueError(f"{key}={getattr(self, key)} is for objective {' or '.join(objectives)}; this is "
                                 f"objective={self.objective}")
        if self.label_smoothing and self.dpo_loss == "ipo":
            raise ValueError("label_smoothing is for dpo_loss=sigmoid: IPO's squared loss has no smoothing")
        if self.objective != "sft" and self.compile_scope == "model":
            raise ValueError(f"compile_scope=model with objective={self.objective}: the preference loss takes the "
                             "answers' tokens, a count known from the data only; use compile_scope=blocks")

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
    def preference(self) -> bool:
        """A preference objective: pairs of answers, each micro-batch both answers' rows (engine.preference)."""
        return self.objective != "sft"

    @property
    def rows_per_micro(self) -> int:
        """Rows a micro-batch runs: batch_size, or both answers' rows of batch_size pairs (tokens/s counts all)."""
        return self.batch_size * (2 if self.preference else 1)

    @property
    def frozen_float8(self) -> bool:
        """A LoRA/QLoRA base computing in float8 (models.float8_frozen), not torchao's full fine-tuning float8."""
        return self.float8 != "off" and self.method != "full"

    def config_hash(self) -> str:
        """Identity of the workload (launch fields excluded), used to match results across sweeps."""
        return config_hash(identity(type(self), self.model_dump()))


def _is_endpoint(s: str) -> bool:
    host, _, port = s.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
