"""`tunebench infer`: greedy generation, per precision and batch size.

Our own decode loop over the Hugging Face model (no `generate` machinery per token): one prefill
forward over the prompt, the first token chosen from its last position (time to first token), then
one forward per new token. Every sequence generates exactly `new_tokens` tokens (no early stop),
so the work is the same at every repeat. The KV cache is transformers' DynamicCache (grows) or
StaticCache (preallocated, reset in place between repeats); with `compile` the decode step is
torch.compile'd in reduce-overhead mode, which replays it as a CUDA graph. Times come from CUDA
events (perf_counter on CPU); the record holds the medians over the timed repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import torch
from transformers import DynamicCache, StaticCache

from tunebench.config import InferConfig
from tunebench.engine.model import count_params
from tunebench.environment import environment
from tunebench.errors import invalid
from tunebench.inference import recorded, require_bitsandbytes, weights_for
from tunebench.metrics import telemetry
from tunebench.metrics.memory import peak_memory, release, reset_peak
from tunebench.metrics.timer import StepTimer
from tunebench.models import ModelSpec, resolve_model
from tunebench.models.build import build
from tunebench.preflight import Plan, resolve_device
from tunebench.record import InferMetrics, ResultRecord
from tunebench.status import failure

Log = Callable[[str], None]


def preflight(cfg: InferConfig) -> Plan:
    spec = resolve_model(cfg.model)
    total = cfg.prompt_len + cfg.new_tokens
    if spec.max_positions and total > spec.max_positions:
        raise invalid("prompt_len", cfg.prompt_len, f"prompt_len + new_tokens = {total} is above the model's "
                                                    f"maximum of {spec.max_positions} positions")
    device = resolve_device(cfg.device)
    if device.type == "cpu" and cfg.attn == "flash":
        raise invalid("attn", "flash", "flash attention needs a CUDA GPU (use sdpa)")
    require_bitsandbytes(cfg.precisions)
    return Plan(cfg, device, spec)


@torch.inference_mode()
def generate(model, step, ids: torch.Tensor, new_tokens: int, cache=None) -> tuple[float, float, torch.Tensor]:
    """Greedy generation of `new_tokens` per sequence: (time to first token, time of the rest, the tokens).

    `step` runs the decode steps (the model, or its compiled form); `cache` a StaticCache to reuse
    (reset in place), or None for a new DynamicCache.
    """
    prompt = ids.shape[1]
    if cache is None:
        cache = DynamicCache(config=model.config)
    else:
        cache.reset()
    timer = StepTimer(ids.device)  # marks on the device's clock: the first token, then the last
    timer.start()
    out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt, device=ids.device),
                use_cache=True, logits_to_keep=1)
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    timer.step_end()
    tokens = [tok]
    for i in range(new_tokens - 1):
        pos = torch.full((1,), prompt + i, dtype=torch.long, device=ids.device)
        out = step(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(tok)
    timer.step_end()
    _, (ttft, decode) = timer.finish()
    return ttft, decode, torch.cat(tokens, dim=1)


def run_infer(cfg: InferConfig, log: Log) -> Iterator[ResultRecord]:
    """One record per precision and batch size, yielded as each finishes."""
    plan = preflight(cfg)
    spec, device = plan.spec, plan.device
    env = environment(device)
    for precision in cfg.precisions:
        try:
            model, source = build(spec, weights_for(precision, cfg), device)
        except Exception as err:  # the model does not fit or load: every batch size of it says so
            status, why = failure(err)
            for b in cfg.batch_sizes:
                config, h = cfg.record_config(precision=precision, batch_size=b)
                yield ResultRecord(kind="infer", status=status, error=why, config=config, config_hash=h,
                                   environment=env, tags=cfg.tag, metrics=InferMetrics(batch_size=b))
            continue
        model.eval()
        step = model
        if cfg.compile:  # CUDA graphs on GPUs; graph breaks (bitsandbytes kernels) are allowed
            step = torch.compile(model, mode="reduce-overhead" if device.type == "cuda" else "default")
        for b in cfg.batch_sizes:
            yield _measure(cfg, spec, model, step, precision, b, source, device, env, log)
        del model, step
        release(device)



def _measure(cfg: InferConfig, spec: ModelSpec, model, step, precision: str, batch: int, source: str,
             device: torch.device, env: dict, log: Log) -> ResultRecord:
    config, h = cfg.record_config(precision=precision, batch_size=batch)
    m = InferMetrics(batch_size=batch, prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens, weights=source,
                     model_bytes=model.get_memory_footprint(), params_total=count_params(model)[0])
    rec = ResultRecord(kind="infer", config=config, config_hash=h, environment=env, tags=cfg.tag, metrics=m)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    sampler = None
    with recorded(rec, log, f"infer {spec.name} {precision} batch {batch}"):
        ids = torch.randint(0, spec.vocab_size, (batch, cfg.prompt_len), device=device, generator=gen)
        cache = StaticCache(config=model.config, max_cache_len=cfg.prompt_len + cfg.new_tokens) \
            if cfg.kv_cache == "static" else None
        release(device)
        reset_peak(device)
        t0 = time.perf_counter()
        for _ in range(cfg.warmup):
            generate(model, step, ids, cfg.new_tokens, cache)
        m.warmup_s = time.perf_counter() - t0
        sampler = telemetry.start(device, cfg.telemetry)
        for _ in range(cfg.repeats):
            ttft, decode, _ = generate(model, step, ids, cfg.new_tokens, cache)
            m.ttft_all_s.append(ttft)
            m.decode_all_s.append(decode)
        m.telemetry = sampler.stop() if sampler else None
        _figures(m, batch, cfg)
        for k, v in peak_memory(device).items():
            setattr(m, k, v)
        log(f"infer {spec.name} {precision} batch {batch}: {m.tokens_per_s:,.1f} tokens/s, TTFT "
            f"{m.ttft_s * 1e3:,.1f} ms, decode {m.decode_tokens_per_s:,.1f} tokens/s ({m.ms_per_token:.2f} ms/step)")
    if sampler:  # after a failure the sampler is still running
        sampler.stop()
    return rec


def _figures(m: InferMetrics, batch: int, cfg: InferConfig) -> None:
    """Medians over the repeats, and the throughputs they give."""
    m.repeats = len(m.ttft_all_s)
    m.ttft_s = statistics.median(m.ttft_all_s)
    m.decode_s = statistics.median(m.decode_all_s)
    total = statistics.median(t + d for t, d in zip(m.ttft_all_s, m.decode_all_s))
    m.tokens_per_s = batch * cfg.new_tokens / total
    m.prefill_tokens_per_s = batch * cfg.prompt_len / m.ttft_s
    steps = cfg.new_tokens - 1
    m.decode_tokens_per_s = batch * steps / m.decode_s
    m.ms_per_token = m.decode_s / steps * 1e3
    m.weight_read_gbps = m.model_bytes * steps / m.decode_s / 1e9 if m.model_bytes else None
    if m.telemetry:
        m.energy_j_per_token = m.telemetry["energy_j"] / (batch * cfg.new_tokens * m.repeats)
