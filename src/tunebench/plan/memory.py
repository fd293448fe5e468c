"""Peak GPU memory of one training step, item by item, phase by phase.

The allocator's peak (what runs record as peak_mem_allocated_bytes) is the largest of three moments:
  forward   the model states, the activations of every block, and the loss's chunk of logits
  backward  the same, as the first block's gradient temporaries and the head's gradient appear
            (with checkpointing: one block's activations rebuilt, and its temporaries)
  step      the model states, every gradient, and the optimizer's temporaries
and, for a train job that evaluates, a fourth: its eager forward between steps, beside the model states (and the
CUDA graphs' pool, which runs count in full).
With offload=optimizer the fp32 master weights and Adam's state live in host memory instead (host_bytes); with
offload=activations the blocks' saved activations do, but for the few in flight.
Beyond the allocator's peak a GPU also holds the CUDA context (kernels, cuBLAS and NCCL workspaces)
and the allocator's reserve (freed blocks it keeps, fragmentation): both fitted on GPU runs (plan.calibration,
and each strategy's reserve in its row); they decide whether a configuration fits, not what runs record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunebench.config import BNB_OPTIMIZERS, PACKED_ELEMENTS
from tunebench.plan.activations import Activations, activations
from tunebench.plan.calibration import CAL
from tunebench.plan.states import Item, experts_apart, model_weights, optimizer_state
from tunebench.plan.workload import Workload

LOGITS_PER_CHUNK = 1 << 26  # engine.loss: logits of one chunk
GRAD_GROUP = 3  # engine.loss: chunks per matmul of a trained head's gradient
EVAL_CHUNK_FRACTION = 8  # engine.loss: evaluation's chunks are this fraction of training's
# engine.offload: blocks' saved activations still on the GPU when offloaded: its LAG newest, IN_FLIGHT copies under
# way and the block computing
OFFLOAD_RESIDENT_BLOCKS = 5
GIB = 1 << 30
DS_BUCKET = int(5e8)  # strategies.zero: reduce / all-gather / prefetch bucket size, elements


@dataclass
class MemoryPlan:
    items: list[Item] = field(default_factory=list)  # everything the step allocates, at its largest
    phases: dict[str, float] = field(default_factory=dict)  # forward / backward / step [/ evaluation] -> bytes
    activations: Activations | None = None
    paged_bytes: float = 0.0  # paged optimizer state: managed memory outside the allocator
    host_bytes: float = 0.0  # host memory of each GPU's process: offload=optimizer's fp32 masters, Adam and
    # gradients, or offload=activations' saved activations (pinned)
    context_bytes: float = 0.0
    reserve_bytes: float = 0.0

    @property
    def peak_allocated(self) -> float:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def total(self) -> float:
        """What the GPU must hold: the allocator's peak, its reserve, the context, paged state."""
        return self.peak_allocated + self.reserve_bytes + self.context_bytes + self.paged_bytes

    @property
    def least(self) -> float:
        """What the GPU cannot do without: the reserve trimmed to its floor. PyTorch's allocator frees the cached
        blocks it holds and retries before it reports out of memory, so a peak that fits only so still runs."""
        return self.total - self.reserve_bytes + min(self.reserve_bytes, CAL.reserve_floor_bytes)

    def item(self, name: str) -> float:
        return sum(i.bytes for i in self.items if i.name == name)


def _grads(w: Workload) -> float:
    """Gradients of one GPU once backward is done."""
    if w.offloaded:  # each reduced bucket is copied to the host's fp32 buffers: only the buckets stay (working)
        return 0.0
    if w.deepspeed:
        return 2 * w.trainable / w.sharded  # bf16 partition
    return w.param_bytes * w.trainable / w.sharded


def _working(w: Workload) -> list[Item]:
    """Buffers a strategy holds around the compute: unsharded FSDP units, DeepSpeed buckets."""
    c, cb = w.counts, w.compute_bytes
    if w.collectives == "fsdp":
        root = c.embeddings + (0 if c.tied else c.head) + w.spec.hidden_size
        block = w.gathered(c.per_block, c.block_linears / w.layers)
        return [Item("unsharded root", cb * root, "embeddings, head, final norm gathered for forward and backward"),
                Item("unsharded blocks", 2 * block, "the running block and the one prefetched")]
    if w.collectives == "zero3":
        # the prefetch bucket, and the largest parameter, fetched whole whatever the bucket (the head or embeddings)
        largest = max(w.counts.head, w.counts.embeddings)
        return [Item("gathered parameters", 2 * (min(DS_BUCKET, w.counts.total) + largest),
                     "prefetch bucket and the largest parameter, bf16"),
                Item("gradient bucket", 2 * DS_BUCKET, "DeepSpeed's contiguous reduce buffer, bf16")]
    return []


def _loss_or_blocks(w: Workload, loss_backward: float, blocks: float) -> float:
    """Backward's peak above the saved activations: the loss's gradients, or a block's temporaries. ZeRO-2 allocates
    its two reduce buckets (overlap_comm double-buffers) at the first gradient it is handed, while the loss's kept
    fp32 head gradient is still alive (benchmarks/probes/memory_probe.py --peak-live, Llama-3.2-1B and TinyGPT)."""
    if w.collectives != "zero2":
        return max(loss_backward, blocks)
    return max(loss_backward, 2 * 2 * DS_BUCKET + head_grad_kept(w) + blocks)


def loss_bytes_per_logit(w: Workload) -> int:
    """Bytes the loss holds per logit of one chunk at its peak. On a GPU: the chunk's logits and their gradient in
    the compute dtype (the softmax compiled, no fp32 copy), and for a trained head the gradient of a group of
    GRAD_GROUP chunks beside them (engine.loss). In one graph a chunk's gradient is written straight into its
    group's (benchmarks/probes/memory_probe.py --peak-live: one group's gradient and one chunk's logits). A head
    the loss cannot fuse: chunks checkpointed, two fp32 chunks and two bf16 ones at once."""
    b = w.compute_bytes
    if not w.fused_head:
        return 12
    if w.whole_graph and w.head_trains:
        return b + b * GRAD_GROUP
    return 2 * b + (b * GRAD_GROUP if w.head_trains else 0)


def chunk_rows(w: Workload) -> int:
    """Tokens in one chunk of the loss (engine.loss)."""
    return max(128, LOGITS_PER_CHUNK // w.spec.vocab_size)


def _loss(w: Workload) -> tuple[float, float, float]:
    """(kept through backward, transient peak in the forward, transient in backward) of the loss and head."""
    c, h, tokens = w.counts, w.spec.hidden_size, w.tokens
    vocab = w.spec.vocab_size
    chunk = chunk_rows(w)
    transient = loss_bytes_per_logit(w) * min(chunk, tokens) * vocab
    cast_weight = w.full and w.residual_bytes == 4  # fp32 head weights cast to bf16 for the chunks
    transient += (2 * c.head if cast_weight else 0) + (2 * tokens * h if w.residual_bytes == 4 else 0)
    if w.whole_graph and cast_weight and c.tied:  # one graph casts the tied weight twice: the lookup's and the head's
        transient += 2 * c.head
    kept = head_grad_kept(w)
    # backward scales the kept gradient into a new fp32 tensor, cast again where the weights are bf16
    backward = 2 * kept + (2 * c.head if kept and w.residual_bytes == 2 else 0)
    # one graph allocates the accumulator where it is first written, after the first group of chunks: the forward's
    # peak, among the chunks' logits, holds it only where a second group follows (GPT-2 small at 2,048 tokens, one
    # group: the same peak with and without it, H100 and H200)
    at_peak = 0.0 if w.whole_graph and tokens <= chunk * GRAD_GROUP else kept
    return at_peak, transient, backward


def head_grad_kept(w: Workload) -> float:
    """The head's fp32 gradient, made in forward and kept for backward (engine.loss), in one graph as well: there
    one opaque op accumulates it in place (before, the graph summed every group's 16-bit product at once)."""
    return 4 * w.counts.head if (w.head_trains and w.fused_head) else 0.0


def _head_grad_held(w: Workload, first: bool) -> float:
    """The head's gradient beside a block's backward: FSDP's unsharded bf16 one, to be reduced as backward ends; on
    one GPU a full fine-tune's (its .grad, or autograd's buffer for a tied head: memory_probe.py --peak-live at 32k
    tokens), which the first block's moment counts among every gradient."""
    if w.collectives == "fsdp" and w.head_trains and w.fused_head:
        return 2 * w.counts.head
    return w.param_bytes * w.counts.head if w.strategy.one_process and w.full and not first else 0.0


def _backward_temps(w: Workload, act: Activations, first: bool = False) -> float:
    """Gradient temporaries of the block being differentiated (and its rebuilt activations when checkpointed);
    `first`: the first block's, differentiated last, whose traced backward holds that block alone. A dense full
    fine-tune's after its traced recompute: what the probes found alive, counted whole (activations)."""
    if act.traced_backward is not None:
        return w.tokens * act.traced_backward
    s = w.spec
    inner = w.mlp_width
    # the MLP's input gradients; chunked, one chunk's forward rebuilt beside them (gate, up, their product, SiLU's)
    temps = (6 * w.chunked_mlp if w.chunked_mlp else 2 * w.tokens) * inner * w.compute_bytes
    if w.experts:  # a sparse block's: the gradients of its experts' outputs and of the tokens they gathered
        temps += 2 * w.tokens * w.experts.active * s.hidden_size * w.compute_bytes
    if act.attention == "math":  # gradients of the S x S probabilities
        temps += 2 * w.cfg.rows_per_micro * s.num_heads * w.cfg.seq_len ** 2 * w.compute_bytes
    if w.checkpointed_share:
        temps += w.tokens * act.per_layer + act.per_block
    if w.recompute_traced and w.recomputed_share:
        # an adapted dense block's traced backward holds more than the one block it rebuilds (the next one's
        # recompute begun), but for the first block's, the last; a sparse block's holds that block alone beside its
        # dequantized experts (benchmarks/probes/memory_probe.py --peak-live shows it); a full fine-tune's dense
        # block is counted whole above (activations: no next block begun there)
        sparse = w.experts.sparse / w.layers if w.experts else 0.0
        temps += 0.0 if first else CAL.traced_extra_blocks * (1 - sparse) * w.tokens * act.per_layer
        # QLoRA's block weights rebuilt for its backward: bf16, or e4m3 with a frozen float8 base (not measured)
        rebuilt = 1 if w.cfg.frozen_float8 else 2
        temps += rebuilt * w.counts.block_linears / w.layers if w.cfg.method == "qlora" else 0.0
    return temps


def _fsdp_backward_end(w: Workload) -> float:
    """FSDP2 as backward ends, beyond every shard's gradient: the root's unsharded bf16 gradients still to reduce,
    and the reduce-scatter input of the last block reduced (fp32; bf16-pure: bf16)."""
    if w.collectives != "fsdp" or not w.full:
        return 0.0
    root = w.counts.embeddings + (0 if w.counts.tied else w.counts.head)
    return 2 * root + w.reduce_bytes * w.counts.per_block


def _block_in_backward(w: Workload, act: Activations, first: bool = False) -> float:
    """A block's backward temporaries and FSDP2's waiting head gradient, the final norm's saved tensors gone."""
    return _head_grad_held(w, first) + _backward_temps(w, act, first) - w.tokens * act.final_norm


def _first_block_last(w: Workload, act: Activations) -> float:
    """The first block's backward, the last to run: its temporaries beside every other block's gradient. Full
    fine-tunes peak there where a block's gradient temporaries outweigh its own gradient (benchmarks/probes/
    memory_probe.py --peak-live: a mixture of experts' with the other blocks' expert gradients and four tensors of
    k x h tokens alive; Llama-3.1-8B's and 3.2-3B's with their MLP's rebuilt and gradient tensors)."""
    own_gradient = w.param_bytes * w.counts.per_block / w.sharded if w.full else 0.0  # adapters': next to nothing
    return _block_in_backward(w, act, first=True) - own_gradient


def tied_gradient(w: Workload) -> float:
    """A tied embedding's gradient arrives twice: the head's (made in forward, engine.loss) waits in autograd's
    buffer while the lookup's backward makes a dense one of the same size, added into it as backward ends, beside
    every other gradient (benchmarks/probes/memory_probe.py --peak-live: Llama-3.2-1B and 3B, full, checkpointed).
    A CUDA graphs' pool holds it among its own; FSDP2 and DeepSpeed reduce the root's gradients apart."""
    if not (w.full and w.counts.tied) or w.cuda_graphs or w.deepspeed or w.collectives == "fsdp":
        return 0.0
    return w.param_bytes * w.counts.embeddings


def _step_temps(w: Workload) -> float:
    if w.offloaded:  # the gradients go to the host's fp32 buffers, the updated weights come back into place
        return 0.0
    if w.collectives == "zero2":  # beside the bf16 gradient partition: its flattened copy, then that in fp32 (probed)
        return 6 * w.trainable / w.sharded
    if w.deepspeed:
        return 8 * w.trainable / w.sharded  # fp32 gradients of the partition and the update's buffers (measured)
    if w.cfg.optimizer in BNB_OPTIMIZERS and not w.full and w.cfg.strategy != "fsdp":
        # bitsandbytes' 8-bit AdamW over adapters steps them packed (engine.optim.packed): one buffer of adapters
        # and one of their gradients at a time (FSDP2's shards are stepped one by one)
        return 2 * w.param_bytes * min(w.trainable, PACKED_ELEMENTS)
    # foreach AdamW: one temporary in the params' dtype
    return w.param_bytes * w.trainable / w.sharded if w.cfg.optimizer == "adamw" else 0.0


def _graph_pool(w: Workload, acts: float, loss: float, act: Activations) -> float:
    """The CUDA graphs' pool's segments, which runs count in full: the forward's graph's tensors (the saved
    activations, the loss's chunk), then the backward's (the gradients, the last block's temporaries) beside the
    forward's saved ones, most of the gradients in memory of their own. The pool's live bytes never reach that: the
    segments outgrow them by what the backward's recording could not reuse of the saved activations it freed
    (benchmarks/probes/peak_parts.py with PEAK_PARTS_TRACE=1 shows both)."""
    backward = acts + head_grad_kept(w) + CAL.graph_pool_own_gradients * _grads(w) + _backward_temps(w, act)
    return max(acts + loss, backward)


def _evaluation_temps(w: Workload) -> float:
    """An evaluation's eager forward under no_grad (trainer.hooks.evaluate): an fp32 head cast to the compute dtype
    (autocast without its cache casts one weight at a time; a LoRA base already computes in it), a chunk of logits
    in the compute dtype and in fp32, and one block's temporaries, above the step's gradients, states and pool
    (benchmarks/probes/peak_parts.py)."""
    s, cb = w.spec, w.compute_bytes
    inner = w.mlp_width
    cast = cb * w.counts.head if (w.autocast and w.full and w.residual_bytes == 4) else 0.0
    rows = min(w.tokens, max(128, chunk_rows(w) // EVAL_CHUNK_FRACTION))
    return cast + rows * s.vocab_size * (cb + 4) + w.tokens * (2 * inner * cb + 6 * s.hidden_size * 4)


def _grads_in_forward(w: Workload, grads: float) -> float:
    """Gradients alive through the forward. Accumulation keeps them across micro-batches. DDP keeps its buckets (the
    gradients' storage after the first step) and, measured, a second copy of the gradients when it communicates or
    accumulates."""
    if w.collectives == "all_reduce":
        return grads * (2 if w.world > 1 or w.cfg.grad_accum > 1 else 1)
    if w.collectives == "fsdp" and w.cfg.grad_accum > 1:  # no_sync accumulates unsharded gradients
        return w.compute_bytes * w.trainable
    return grads if w.cfg.grad_accum > 1 else 0.0


def _weight_casts(w: Workload) -> float:
    """fp32 weights under autocast on one GPU, compiled: each block linear's bf16 copy, made in forward, is what its
    backward multiplies by; without checkpointing the graph keeps it until then (about 2 bytes a block parameter
    in the records; a foreach AdamW's larger step peak hid it). Not added under DDP, whose records fit without it,
    nor FSDP2 (bf16 weights gathered per block)."""
    whole_fp32 = w.full and w.autocast and w.strategy.one_process
    return 2 * w.counts.block_linears if (whole_fp32 and w.cfg.compile and not w.checkpointed_share) else 0.0


def memory(w: Workload) -> MemoryPlan:
    act = activations(w)
    weights, working = experts_apart(w, model_weights(w)), _working(w)
    opt, paged = optimizer_state(w)
    grads = _grads(w)
    kept_loss, loss_transient, loss_backward = _loss(w)
    saved = act.saved_by_blocks(w)
    # offload=activations: they wait in host memory; on the GPU only those in flight (engine.offload)
    resident = min(w.layers, OFFLOAD_RESIDENT_BLOCKS) / w.layers if w.activations_offloaded else 1.0
    acts = saved * resident + w.tokens * act.outside
    persistent = sum(i.bytes for i in weights + working) + opt
    grads_in_forward = _grads_in_forward(w, grads)
    acts += _weight_casts(w)
    forward = persistent + grads_in_forward + acts + kept_loss + loss_transient
    # backward: first the loss's gradients, then (once they and the final norm's saved tensors are freed: the probe
    # at 32k tokens) the last block's temporaries
    blocks = _block_in_backward(w, act)
    backward = persistent + grads_in_forward + acts + _loss_or_blocks(w, loss_backward, blocks)
    # the end of backward: every gradient, and FSDP2's root gradients still to reduce or a tied embedding's second
    backward = max(backward, persistent + grads + _fsdp_backward_end(w) + tied_gradient(w),
                   persistent + grads + _first_block_last(w, act))
    step = persistent + grads + _step_temps(w)
    pools = 0.0
    if w.cuda_graphs:  # the graphs' pool, counted in full (phases: what lives outside it, and the pool)
        pools = _graph_pool(w, acts, kept_loss + loss_transient, act) + CAL.cuda_graph_pool_slack
        outside = persistent + grads_in_forward  # accumulation's gradients live outside, added into (grads_kept)
        forward, backward, step = outside + pools, outside + pools, outside + pools + _step_temps(w)
    phases = {"forward": forward, "backward": backward, "step": step}
    evaluation = _evaluation_temps(w) if w.evaluates else 0.0
    if w.evaluates:  # between steps, eagerly and outside the pool: the pool and the kept gradients stay
        phases["evaluation"] = persistent + grads_in_forward + pools + evaluation
    items = weights + [Item("optimizer states", opt + paged, w.cfg.optimizer + (" (paged: managed memory)" if paged
                                                                               else "")),
                       Item("gradients", grads, "bf16 partition" if w.deepspeed else "bf16" if w.pure else "fp32"),
                       Item("activations", acts, act.note),
                       Item("loss chunk", loss_transient + kept_loss, "logits of one chunk; the head's gradient")]
    items += working
    if pools:  # the activations, the loss's chunk and (but for accumulation's) the gradients are the pool's
        beyond = pools - acts - kept_loss - loss_transient - (grads - grads_in_forward)
        items.append(Item("CUDA graphs' pools", max(beyond, 0.0), "beyond the tensors above: backward's outputs "
                                                                   "recorded beside the forward's (cuda_graphs)"))
    if w.evaluates:
        items.append(Item("evaluation", evaluation, "eager forward between steps: the head cast, "
                                                              "a chunk of logits, one block's temporaries"))
    plan = MemoryPlan(items, phases, act, paged)
    if w.offloaded:  # fp32 master weights, Adam's two moments and the fp32 gradients of the partition
        plan.host_bytes = 16 * w.trainable / w.sharded
    if w.activations_offloaded:  # pinned
        plan.host_bytes = saved
    context = CAL.context_bytes
    plan.context_bytes = context[1] if w.world == 1 and w.strategy.one_process else (
        context["nccl"] if w.world == 1 else context["nccl-multi"])
    # replayed as CUDA graphs, the peak counts the pools' segments in full: the allocator keeps little beyond it
    plan.reserve_bytes = CAL.graph_reserve_bytes if w.cuda_graphs else max(
        CAL.reserve_floor_bytes, w.strategy.planner.reserve * plan.peak_allocated)
    return plan
