"""Preference objectives over pairs of answers (DPO and IPO, SimPO, ORPO), on the engine SFT trains with.

A micro-batch of B pairs is 2B rows: the chosen answers' rows, then the rejected answers' (one forward for both,
as the reference implementations concatenate them). Labels are the answers' tokens, every other one IGNORE. Packed
rows hold several pairs: the k-th example of a chosen row and the k-th of its rejected row are one pair (data.rows
lays them out so); an example's tokens are found by its position ids, which restart at 0.

An answer's log-probability is the sum of its tokens' log-softmax at the label (engine.answer_logps).

DPO's reference, in the order tried: log-probabilities precomputed before training and carried by the batch; the
model with its adapters disabled (LoRA, QLoRA: one model in memory); a frozen copy (full fine-tuning). It runs
first and keeps no activations, so they are gone before the policy's exist. Where the blocks are compiled, the
reference runs in the caller's grad mode with nothing saved, so that it is the policy's own compiled graph, rounding
as it does: the adapters are not disabled but scaled by zero (methods.adapter_gate); the frozen copy's blocks are
checkpointed as the policy's and its weights marked as trained.

The losses are those of the reference implementations (TRL's DPOTrainer, CPOTrainer with loss_type simpo,
ORPOTrainer; tests/test_preference.py compares losses, rewards and gradients): with c, r the chosen and rejected
answers' log-probabilities, avg their per-token means, and c0, r0 the reference's,

  dpo (sigmoid)  -(1-e) log s(b*d) - e log s(-b*d),  d = (c - c0) - (r - r0)      rewards b(c - c0), b(r - r0)
  dpo (ipo)      (d' - 1/(2b))^2,  d' = (c - c0)/|c| - (r - r0)/|r|                  rewards as dpo
  simpo          -(1-e) log s(b*m) - e log s(-b*m),  m = avg(c) - avg(r) - gamma/b  rewards b avg(c), b avg(r)
  orpo           NLL(chosen answers) - b * mean log s(log odds(avg c) - log odds(avg r))  rewards as simpo

each a mean over the micro-batch's pairs. ORPO's NLL is over the chosen answers' tokens only, as every objective
here trains on the answers alone (TRL's ORPOTrainer also counts the prompt's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from tunebench.engine.answer_logps import AnswerLogps, answer_logps
from tunebench.engine.model import aux_loss, hidden_states, unwrap
from tunebench.methods.adapter_gate import AdapterGate

OBJECTIVES = ("sft", "dpo", "simpo", "orpo")
WITH_REFERENCE = ("dpo",)


@dataclass(frozen=True)
class Preference:
    """An objective's settings (the config keys of the same names)."""

    objective: str
    beta: float = 0.1
    label_smoothing: float = 0.0
    dpo_loss: str = "sigmoid"
    simpo_gamma: float = 0.5

    @classmethod
    def of(cls, cfg) -> Preference:
        return cls(cfg.objective, cfg.beta, cfg.label_smoothing, cfg.dpo_loss, cfg.simpo_gamma)

    @property
    def reference(self) -> bool:
        return self.objective in WITH_REFERENCE




class PairStats(NamedTuple):
    """One micro-batch's pairs: their losses, rewards and which of the (B, K) slots hold a pair."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    valid: torch.Tensor
    loss: torch.Tensor  # the micro-batch's loss (the mean over its pairs, ORPO's NLL added)
    nll_sum: torch.Tensor  # orpo: the chosen answers' summed negative log-likelihood (0 otherwise)
    nll_tokens: torch.Tensor  # and their tokens


# --- the losses ---------------------------------------------------------------------------------------------------


def _smoothed(x: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    return -F.logsigmoid(beta * x) * (1 - eps) - F.logsigmoid(-beta * x) * eps


LOG_PROB_CEILING = -1e-6  # an average log-probability this close to 0 is taken as this: log(1 - p) stays finite


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, each side of -ln 2 by the form without cancellation (TRL's). x is held below
    LOG_PROB_CEILING first: an answer the model is certain of (an average of 0 in fp32) would give -inf, and its
    gradient, through the branch not taken too, NaN."""
    x = x.clamp(max=LOG_PROB_CEILING)
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def pair_stats(p: Preference, policy: AnswerLogps, reference: torch.Tensor | None) -> PairStats:
    """The micro-batch's losses from its answers' log-probabilities (and the reference's sums, for dpo)."""
    half = policy.sums.shape[0] // 2
    c, r = policy.sums[:half], policy.sums[half:]
    nc, nr = policy.counts[:half], policy.counts[half:]
    valid = (nc > 0) & (nr > 0)  # a slot holding a pair (packed rows' unused slots hold none)
    nc1, nr1 = nc.clamp(min=1), nr.clamp(min=1)
    # an empty slot's figures are set where every formula is finite: a NaN there would reach the gradient through
    # the mask below (0 x inf)
    c, r = torch.where(valid, c, -1.0), torch.where(valid, r, -1.0)
    nll = None
    if p.objective == "dpo":
        c0 = torch.where(valid, reference[:half].float(), -1.0)
        r0 = torch.where(valid, reference[half:].float(), -1.0)
        if p.dpo_loss == "ipo":
            losses = ((c - c0) / nc1 - (r - r0) / nr1 - 1 / (2 * p.beta)) ** 2
        else:
            losses = _smoothed((c - c0) - (r - r0), p.beta, p.label_smoothing)
        chosen, rejected = p.beta * (c - c0), p.beta * (r - r0)
    elif p.objective == "simpo":
        ac, ar = c / nc1, r / nr1
        losses = _smoothed(ac - ar - p.simpo_gamma / p.beta, p.beta, p.label_smoothing)
        chosen, rejected = p.beta * ac, p.beta * ar
    elif p.objective == "orpo":
        ac, ar = c / nc1, r / nr1
        log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar))
        losses = -p.beta * F.logsigmoid(log_odds)
        chosen, rejected = p.beta * ac, p.beta * ar
        nll = (-(c * valid).sum(), (nc * valid).sum())
    else:
        raise ValueError(f"objective {p.objective} has no pair loss")
    losses = torch.where(valid, losses, torch.zeros_like(losses))
    loss = losses.sum() / valid.sum().clamp(min=1)
    zero = torch.zeros((), device=loss.device)
    if nll is not None:
        loss = loss + nll[0] / nll[1].clamp(min=1)
    nll_sum, nll_tokens = nll if nll is not None else (zero, zero)
    return PairStats(losses, chosen.detach(), rejected.detach(), valid, loss, nll_sum.detach(), nll_tokens)


# --- the model ----------------------------------------------------------------------------------------------------


def _dropped(t: torch.Tensor) -> None:
    return None


def _never(_: None) -> torch.Tensor:
    raise RuntimeError("the reference's pass has no backward: nothing it saved is kept")


def unsaved() -> contextlib.AbstractContextManager:
    """A forward with gradients on whose graph is never walked back: what it would save for backward is dropped as it
    is saved (nothing held, nothing offloaded), as under no_grad, while it runs the graph that backward would need."""
    return torch.autograd.graph.saved_tensors_hooks(_dropped, _never)


class FrozenReference(nn.Module):
    """DPO's frozen copy of the model (full fine-tuning), under the name the policy's model has (`model`), so that
    slots and sharding find its weights as they find the policy's. It is called with the function to run on the
    model: its own forward is where a sharding strategy gathers its root's weights (FSDP2's hooks)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable, *args) -> torch.Tensor:
        # detached here, inside the sharding's hooks: run with gradients on (the policy's graph) no pre-backward hook
        # is registered on an output no backward will reach
        return fn(self.model, *args).detach()


class PreferenceLM(nn.Module):
    """The model and its preference loss as one module, as CausalLMWithLoss is for SFT: strategies wrap either.

    `reference`: DPO's frozen copy (full fine-tuning without precomputed log-probabilities), kept in a list so that
    it is no submodule of what the strategy wraps, shards and checkpoints; None where the adapters disabled are the
    reference, or where it is precomputed, or for the reference-free objectives. `gate`: the adapters scaled by zero
    are the reference (compiled blocks), rather than peft's adapters disabled; given with `in_graph`: the reference
    runs the policy's compiled graphs (choices.reference_in_policy_graph), in the caller's grad mode, nothing saved."""

    def __init__(self, model: nn.Module, vocab_size: int, preference: Preference, fuse_head: bool = True,
                 per_row: int = 1, reference: FrozenReference | None = None, gate: AdapterGate | None = None,
                 in_graph: bool = False):
        super().__init__()
        self.model = model
        self._gate = gate
        self.in_graph = in_graph
        self.vocab_size = vocab_size
        self.preference = preference
        self.fuse_head = fuse_head
        self.per_row = per_row  # pairs a packed row pair holds at most (1: one pair per row)
        self._reference = [reference] if reference is not None else []
        self.collect: list[PairStats] | None = None  # set by an evaluation: each micro-batch's stats appended
        # "reference": forward returns the reference's answer sums instead of the loss (precomputing them, through
        # whatever wraps this module: FSDP2 gathers the root's weights in its forward hooks only)
        self.mode = "train"
        self._dropout: bool | None = None  # the model has dropout somewhere (found at the first reference pass)

    def _logps(self, hf: nn.Module, input_ids, labels, position_ids, documents,
               reference: bool = False) -> tuple[AnswerLogps, object]:
        if self._gate is not None and not self._gate.installed:  # before the first graph is traced
            self._gate.install(input_ids.device)
        out = hidden_states(hf, input_ids, position_ids, documents, router_logits=torch.is_grad_enabled())
        logps = answer_logps(out.last_hidden_state, hf.get_output_embeddings(), labels, position_ids, self.per_row,
                             self.vocab_size, self.fuse_head, getattr(hf.config, "final_logit_softcapping", None),
                             reference)
        return logps, out

    def reference_logps(self, input_ids, labels, position_ids=None, documents=None) -> torch.Tensor:
        """The reference model's answer sums (2B, K), without gradients: the frozen copy, the adapters disabled (or
        scaled by zero), or (precomputing them before the first step) the model itself."""
        args = (input_ids, labels, position_ids, documents)
        if self.in_graph:
            # the grad mode of the policy's pass it is set against: the caller's; training's where it is precomputed
            grad = torch.is_grad_enabled() or self.mode == "reference"
            gate = self._gate.closed() if self._gate is not None else contextlib.nullcontext()
            with gate, torch.set_grad_enabled(grad), unsaved(), self._deterministic():
                return self._reference_sums(*args).detach()
        with torch.no_grad(), self._deterministic():
            return self._reference_sums(*args)

    def _reference_sums(self, *args) -> torch.Tensor:
        if self._reference:
            copy = self._reference[0]
            if self.in_graph and copy.training != self.model.training:  # the policy's mode: its graphs' guards
                copy.train(self.model.training)
            return copy(lambda m, *a: self._logps(m, *a, reference=self.in_graph)[0].sums, *args)
        if self._gate is None and hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                return self._logps(unwrap(self.model), *args)[0].sums
        if self._gate is None and self.mode != "reference":  # the model itself is the reference only before it trains
            raise RuntimeError("dpo without a reference: no adapters to disable, no frozen copy, and no precomputed "
                               "log-probabilities in the batch")
        return self._logps(unwrap(self.model), *args, reference=self.in_graph)[0].sums

    @contextlib.contextmanager
    def _deterministic(self) -> Iterator[None]:
        """The reference without dropout (TRL's default too): eval mode around its pass where the model has any
        dropout; left alone otherwise (a compiled block's mode is in its guards: a switch would trace it again)."""
        if self._dropout is None:  # the adapters' own dropout does not reach adapters scaled by zero (the gate)
            self._dropout = any(isinstance(m, nn.Dropout) and m.p > 0 and not (self._gate and "lora_dropout" in name)
                                for name, m in self.model.named_modules()) or any(
                float(getattr(unwrap(self.model).config, k, 0) or 0) > 0 for k in ("attention_dropout", "dropout"))
        if not self._dropout or not self.training:
            yield
            return
        self.model.eval()
        try:
            yield
        finally:
            self.model.train()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None = None,
                documents: torch.Tensor | None = None, reference: torch.Tensor | None = None) -> torch.Tensor:
        p = self.preference
        if self.mode == "reference":
            return self.reference_logps(input_ids, labels, position_ids, documents)
        if p.reference and reference is None:
            reference = self.reference_logps(input_ids, labels, position_ids, documents)
        hf = unwrap(self.model)
        policy, out = self._logps(hf, input_ids, labels, position_ids, documents)
        stats = pair_stats(p, policy, reference)
        if self.collect is not None:
            self.collect.append(PairStats(*(t.detach() for t in stats)))
        return stats.loss + aux_loss(hf, out)
