"""save_pretrained without accelerate's DeepSpeed probe, and a model saved ready to generate.

transformers' save_pretrained unwraps the model through accelerate, which imports DeepSpeed (where it is installed)
only to ask whether the model is a DeepSpeedEngine: a slow import and a "Setting accelerator" warning line in every
process that saves a checkpoint or a model, under any strategy. No object is an instance of a class never imported,
so while DeepSpeed is not imported the question is answered without importing it.

A model saved from training keeps the training build's settings; `save_for_generation` writes it with its KV
cache on and a generation config whose stop and padding ids are the tokenizer's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn


@contextmanager
def no_deepspeed_probe() -> Iterator[None]:
    try:
        from accelerate.utils import other
    except ImportError:  # no accelerate: transformers unwraps without it
        yield
        return
    probe = getattr(other, "is_deepspeed_available", None)
    if probe is None or "deepspeed" in sys.modules:  # another accelerate, or DeepSpeed runs here: ask it
        yield
        return
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe


def save_pretrained(model: nn.Module, path: str | Path, **kwargs) -> None:
    """`model.save_pretrained(path, **kwargs)` (a transformers or peft model), DeepSpeed left unimported."""
    with no_deepspeed_probe():
        model.save_pretrained(path, **kwargs)


def generation_config(tokenizer, source: Path | None, own_tokenizer: bool):
    """What a saved model generates with: the model folder's generation config where it has one (its sampling
    defaults), the KV cache on, and the tokenizer's end-of-sequence, padding (its end-of-sequence where it has
    none) and beginning ids. End ids the folder's config adds (Llama-3's instruct models stop at either of two)
    are kept after the tokenizer's only where the tokenizer is the model's own: they are another's ids otherwise."""
    from transformers import GenerationConfig

    found = source is not None and (Path(source) / "generation_config.json").is_file()
    gen = GenerationConfig.from_pretrained(source, local_files_only=True) if found else GenerationConfig()
    eos = tokenizer.eos_token_id
    if eos is not None:
        theirs = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        ends = [eos] + [i for i in theirs if own_tokenizer and i is not None and i != eos]
        gen.eos_token_id = ends[0] if len(ends) == 1 else ends
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if pad is not None:
        gen.pad_token_id = pad
    if tokenizer.bos_token_id is not None:
        gen.bos_token_id = tokenizer.bos_token_id
    gen.use_cache = True
    # set on purpose: not to be re-derived from the model's config, as generate() does with one made from it
    gen._from_model_config = False
    return gen


def save_for_generation(model: nn.Module, path: str | Path, generation, **kwargs) -> None:
    """`save_pretrained` with the KV cache on in config.json (training builds turn it off: a model saved so would
    generate without its cache, recomputing every earlier token at each new one) and `generation` (a
    GenerationConfig) as generation_config.json; `model` itself is left as it was."""
    config, before = model.config, (model.config.use_cache, getattr(model, "generation_config", None))
    config.use_cache, model.generation_config = True, generation
    try:
        save_pretrained(model, path, **kwargs)
    finally:
        config.use_cache, model.generation_config = before
