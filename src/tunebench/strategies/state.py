"""How each strategy saves and restores a training job's state, and hands out the trained weights.

    Replicated   single process and DDP: every rank holds everything; rank 0 writes the trainable
                 weights with save_pretrained (a peft adapter, or the full model as sharded safetensors)
                 and the optimizer; every rank reads them back.
    Sharded      FSDP2: torch.distributed.checkpoint, each rank writing and reading its own shards
                 (frozen base weights left out for LoRA). DCP reshards on load, but the data position is
                 per world size, so a resume needs the same world size.
    DeepSpeedState  ZeRO-2/3: DeepSpeed's own checkpoint (engine.save_checkpoint / load_checkpoint).

`export(ctx)` gives rank 0 the full state dict of the Hugging Face model (or peft model) that trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tunebench.models.save import save_pretrained

PREFIX = "model."  # CausalLMWithLoss keeps the Hugging Face model as .model


def _strip(sd: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix(PREFIX): v for k, v in sd.items()}


def _is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


class Replicated:
    def __init__(self, wrapper: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = wrapper.model, optimizer  # the HF (or peft) model, unwrapped

    def save(self, path: Path, ctx) -> None:
        if ctx.is_main:
            save_pretrained(self.model, path / "model", safe_serialization=True)
            torch.save(self.optimizer.state_dict(), path / "optimizer.pt")

    def load(self, path: Path, ctx) -> None:
        from safetensors.torch import load_file

        weights = {}
        for f in sorted((path / "model").glob("*.safetensors")):
            weights |= load_file(str(f))
        device = next(p.device for p in self.model.parameters())
        if _is_peft(self.model):
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, {k: v.to(device) for k, v in weights.items()})
        else:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or [m for m in missing if not _tied(self.model, m)]:
                raise RuntimeError(f"checkpoint weights do not match the model (missing {missing[:3]}, "
                                   f"unexpected {unexpected[:3]})")
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=False))

    def export(self, ctx) -> dict[str, Any] | None:
        return self.model.state_dict() if ctx.is_main else None


def _tied(model: nn.Module, name: str) -> bool:
    """A weight save_pretrained leaves out because it is the same tensor as another (a tied head)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head is not None and name.endswith("weight") and "lm_head" in name


class Sharded:
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, frozen_base: bool):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        self.module, self.optimizer = module, optimizer
        # a frozen base is rebuilt as it was (same seed or checkpoint) and left out of the checkpoint; loading
        # then expects only what trains
        self.options = StateDictOptions(ignore_frozen_params=frozen_base, strict=not frozen_base)

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.module, self.optimizer, options=self.options)
        return {"model": msd, "optim": osd}

    def save(self, path: Path, ctx) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(path / "dcp"))

    def load(self, path: Path, ctx) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=self.options)

    def export(self, ctx) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _strip(sd) if ctx.is_main else None


class DeepSpeedState:
    def __init__(self, engine: Any, stage: int, quantized_base: bool = False):
        self.engine, self.stage = engine, stage
        # bitsandbytes saves a 4-bit weight's quantization state as extra keys its partitioned layer does not take
        # back; the base is rebuilt as it was, and what trains is restored from the optimizer's partitions
        self.strict = not quantized_base

    def save(self, path: Path, ctx) -> None:
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="state")

    def load(self, path: Path, ctx) -> None:
        self.engine.load_checkpoint(str(path / "deepspeed"), tag="state", load_optimizer_states=True,
                                    load_lr_scheduler_states=False, load_module_strict=self.strict)

    def export(self, ctx) -> dict[str, Any] | None:
        if self.stage == 3:
            sd = self.engine._zero3_consolidated_16bit_state_dict()  # a collective: every rank calls it
            return _strip(sd) if ctx.is_main else None
        return _strip(self.engine.module.state_dict()) if ctx.is_main else None
