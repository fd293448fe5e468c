"""The model and its loss as one module, so DDP, FSDP and DeepSpeed each see a single forward."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from tunebench.engine.loss import causal_lm_loss
from tunebench.models.attention import NAME as SDPA


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _numel(p: torch.Tensor) -> int:
    """Parameters a tensor stands for: a packed 4-bit weight counts its unpacked shape, as LoRA's base does."""
    shape = getattr(p, "unpacked_shape", None)  # a sharded 4-bit placeholder (models.sharded4bit)
    qs = getattr(p, "quant_state", None)
    if shape is None and qs is not None:
        shape = getattr(qs, "shape", None)
    if shape is None:  # a ZeRO-3 partitioned parameter: its whole shape
        shape = getattr(p, "ds_shape", None)
    return int(torch.Size(shape).numel()) if shape else p.numel()


def count_params(model: nn.Module) -> tuple[int, int]:
    """(every parameter, the trainable ones), each tied tensor once."""
    params = list({id(p): p for p in model.parameters()}.values())
    return sum(_numel(p) for p in params), sum(_numel(p) for p in params if p.requires_grad)


def transformer_blocks(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The list of decoder blocks (Llama/Mistral `layers`, GPT-2 `h`), found by its length."""
    for mod in unwrap(model).base_model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == num_layers:
            return mod
    raise ValueError("no list of transformer blocks found in the model")


class CausalLMWithLoss(nn.Module):
    def __init__(self, model: nn.Module, vocab_size: int, fuse_head: bool = True, masked_labels: bool = False):
        super().__init__()
        self.model = model
        self.vocab_size = vocab_size
        self.fuse_head = fuse_head  # False where the head's weight is only gathered by its own forward (ZeRO-3)
        self.masked_labels = masked_labels  # real data: some labels are ignored (-100)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None = None,
                documents: torch.Tensor | None = None, reference: torch.Tensor | None = None) -> torch.Tensor:
        hf = unwrap(self.model)
        out = hidden_states(hf, input_ids, position_ids, documents)
        config = hf.config
        loss = causal_lm_loss(out.last_hidden_state, hf.get_output_embeddings(), labels, self.vocab_size,
                              fuse=self.fuse_head, masked=self.masked_labels,
                              softcap=getattr(config, "final_logit_softcapping", None))
        return loss + aux_loss(hf, out)


def eager_if_whole(module: nn.Module) -> contextlib.AbstractContextManager:
    """A model compiled whole (compile_scope model) is evaluated eagerly: a second, no-grad graph of the whole model
    beside the training one made the training graph fail to compile (dynamo's assertion in the fused loss). Blocks
    compiled one by one are evaluated compiled."""
    whole = any(isinstance(m, CausalLMWithLoss) and getattr(m, "_compiled_call_impl", None) is not None
                for m in module.modules())
    return torch.compiler.set_stance("force_eager") if whole else contextlib.nullcontext()


def hidden_states(hf: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                  documents: torch.Tensor | None, router_logits: bool = True):
    """The model's last hidden states (and a mixture of experts' router logits where its config asks for them)."""
    extra = {}
    if hf.config._attn_implementation == SDPA:
        # Rows without position ids are whole sequences: plainly causal, which transformers cannot tell when
        # traced; packed rows' examples are attended apart (models.attention)
        extra = {"plain_causal": True} if position_ids is None else {"documents": documents}
    if router_logits and getattr(hf.config, "output_router_logits", False):
        extra["output_router_logits"] = True
    return hf.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra)


def aux_loss(hf: nn.Module, out) -> torch.Tensor | float:
    """A mixture of experts' load-balancing term, weighted as its ForCausalLM adds it (0 for other models)."""
    config = hf.config
    if not getattr(config, "output_router_logits", False) or getattr(out, "router_logits", None) is None:
        return 0.0
    return config.router_aux_loss_coef * load_balancing_loss(hf, out.router_logits)


def load_balancing_loss(hf: nn.Module, router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The model's own auxiliary loss over its routers' logits (every token of the batch), as its ForCausalLM adds it
    when the config asks for router logits: the function of the model's modeling module."""
    import sys

    config = hf.config
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    balance = sys.modules[type(hf).__module__].load_balancing_loss_func
    return balance(router_logits, experts, config.num_experts_per_tok, None)
