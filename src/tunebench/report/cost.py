"""Cost from throughput and a price sheet: $/1K samples, $/1M tokens, tokens per $, and a job's time and cost.

A run on N GPUs costs N x the per-GPU price; its throughput is the global figure, so the same
formulas hold for one GPU and for the measured multi-GPU runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from tunebench.config.yamlfile import load_yaml_file
from tunebench.errors import UserError
from tunebench.record import ResultRecord

DEFAULT_JOB_SAMPLES = 10_000


@dataclass(frozen=True)
class Offering:
    name: str
    gpu: str  # pattern searched in the GPU's name
    provider: str
    on_demand: float | None
    spot: float | None
    source: str
    date: str


def load_prices(path: str | Path | None = None) -> list[Offering]:
    try:
        data = (load_yaml_file(path, "price sheet") if path
                else yaml.safe_load(resources.files("tunebench").joinpath("prices.yaml").read_text()))
        return [_checked(Offering(o["name"], str(o["gpu"]), o.get("provider", o["name"]), o.get("on_demand"),
                                  o.get("spot"), str(o.get("source", "")), str(o.get("date", ""))), path)
                for o in data["offerings"]]
    except FileNotFoundError:
        raise UserError(f"price sheet {path} does not exist") from None
    except (yaml.YAMLError, KeyError, TypeError) as err:
        raise UserError(f"price sheet {path or 'prices.yaml'} is malformed: {err}") from None


def _checked(o: Offering, path) -> Offering:
    """An offering whose GPU pattern compiles and matches something, and whose prices are dollars an hour (a
    finite number above 0, or none): any other value would make every cost of the report wrong or fail it."""
    where = f"price sheet {path or 'prices.yaml'}: offering {o.name!r}"
    try:
        re.compile(o.gpu)
    except re.error as err:
        raise UserError(f"{where}: gpu={o.gpu!r} is not a valid pattern ({err})") from None
    if not o.gpu.strip():
        raise UserError(f"{where}: gpu is empty (it would match every GPU); give the GPU's name or a pattern")
    for field in ("on_demand", "spot"):
        v = getattr(o, field)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0):
            raise UserError(f"{where}: {field}={v!r} must be a price in dollars an hour above 0 (or left out)")
    return o


def offerings_for(gpu_name: str | None, prices: list[Offering]) -> list[Offering]:
    if not gpu_name:
        return []
    return [o for o in prices if re.search(o.gpu, gpu_name, re.IGNORECASE)]


@dataclass(frozen=True)
class Cost:
    offering: Offering
    spot: bool
    gpus: int
    dollars_per_hour: float  # all GPUs of the run
    per_1k_samples: float
    per_1m_tokens: float
    tokens_per_dollar: float
    job_samples: int
    job_hours: float
    job_cost: float


def cost_of(rec: ResultRecord, offering: Offering, spot: bool = False,
            job_samples: int = DEFAULT_JOB_SAMPLES) -> Cost | None:
    m = rec.metrics
    price = offering.spot if spot else offering.on_demand
    if price is None or not m.tokens_per_s or not m.samples_per_s:
        return None
    hourly = price * m.world_size
    job_hours = job_samples / m.samples_per_s / 3600
    return Cost(offering, spot, m.world_size, hourly,
                per_1k_samples=hourly / (m.samples_per_s * 3600) * 1000,
                per_1m_tokens=hourly / (m.tokens_per_s * 3600) * 1e6,
                tokens_per_dollar=m.tokens_per_s * 3600 / hourly,
                job_samples=job_samples, job_hours=job_hours, job_cost=job_hours * hourly)


def cheapest(rec: ResultRecord, prices: list[Offering], spot: bool = False,
             job_samples: int = DEFAULT_JOB_SAMPLES) -> Cost | None:
    gpu = rec.environment.get("gpu", {}).get("name")
    costs = [c for o in offerings_for(gpu, prices) if (c := cost_of(rec, o, spot, job_samples))]
    return min(costs, key=lambda c: c.dollars_per_hour) if costs else None


def on_demand_cost(secs: float, world: int, gpu: str | None) -> str:
    """', $X on demand at PROVIDER' for `secs` on `world` GPUs at the price sheet's cheapest; '' without a price."""
    offers = [o for o in offerings_for(gpu, load_prices()) if o.on_demand]
    if not offers:
        return ""
    o = min(offers, key=lambda o: o.on_demand)
    return f", ${secs / 3600 * world * o.on_demand:.2f} on demand at {o.provider}"
