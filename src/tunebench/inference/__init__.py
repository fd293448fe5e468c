"""Model loading and text generation benchmarks (`tunebench load`, `tunebench infer`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from tunebench.config import InferConfig, LoadConfig, config_hash
from tunebench.errors import UserError
from tunebench.models.build import Weights
from tunebench.record import ResultRecord

QUANTIZED = ("int8", "nf4", "fp4")


def weights_for(precision: str, cfg: LoadConfig | InferConfig) -> Weights:
    """Inference weights at one precision: bf16/fp16 as they are; int8/nf4/fp4 through bitsandbytes."""
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    quant = precision if precision in QUANTIZED else None
    return Weights(dtype=dtype, quant=quant, compute_dtype=dtype, double_quant=cfg.double_quant, attn=cfg.attn,
                   seed=cfg.seed, use_cache=True)


def require_bitsandbytes(precisions: list[str]) -> None:
    if any(p in QUANTIZED for p in precisions):
        try:
            import bitsandbytes  # noqa: F401
        except Exception:  # a broken install is as missing as an absent one
            raise UserError(f"precisions {', '.join(p for p in precisions if p in QUANTIZED)} need the "
                            "'bitsandbytes' package, which is not installed (pip install bitsandbytes)") from None


def record_config(cfg: LoadConfig | InferConfig, **one: object) -> tuple[dict, str]:
    """One record's config (the command's, with the lists it iterates replaced by this record's values)
    and its hash (tags and telemetry left out, as for training runs)."""
    data = cfg.model_dump(exclude={"precisions", "batch_sizes"}) | one
    return data, config_hash({k: v for k, v in data.items() if k not in ("tag", "telemetry")})


@contextlib.contextmanager
def recorded(rec: ResultRecord, log: Callable[[str], None], what: str) -> Iterator[None]:
    """Run one measurement: ok if the body finishes; an exception becomes the record's status and error
    (a precision or batch size that fails is a result, and the next one still runs)."""
    from tunebench.runner import failure

    try:
        yield
        rec.status = "ok"
    except Exception as err:
        rec.status, rec.error = failure(err)
        log(f"{what}: {rec.status}: {rec.error.strip().splitlines()[-1]}")
