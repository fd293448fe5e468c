"""Model loading and text generation benchmarks (`tunebench load`, `tunebench infer`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from tunebench.config import InferConfig, LoadConfig
from tunebench.errors import require
from tunebench.format import headline
from tunebench.models.build import Weights
from tunebench.record import ResultRecord
from tunebench.status import failure

QUANTIZED = ("int8", "nf4", "fp4")


def weights_for(precision: str, cfg: LoadConfig | InferConfig) -> Weights:
    """Inference weights at one precision: bf16/fp16 as they are; int8/nf4/fp4 through bitsandbytes."""
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    quant = precision if precision in QUANTIZED else None
    return Weights(dtype=dtype, quant=quant, compute_dtype=dtype, double_quant=cfg.double_quant, attn=cfg.attn,
                   seed=cfg.seed, use_cache=True)


def require_bitsandbytes(precisions: list[str]) -> None:
    quantized = [p for p in precisions if p in QUANTIZED]
    if quantized:
        require("bitsandbytes", f"precisions {', '.join(quantized)}")


@contextlib.contextmanager
def recorded(rec: ResultRecord, log: Callable[[str], None], what: str) -> Iterator[None]:
    """Run one measurement: ok if the body finishes; an exception becomes the record's status and error
    (a precision or batch size that fails is a result, and the next one still runs)."""
    try:
        yield
        rec.status = "ok"
    except Exception as err:
        rec.status, rec.error = failure(err)
        log(f"{what}: {rec.status}: {headline(rec.error)}")
