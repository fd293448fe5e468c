"""`tunebench load`: how long a model takes to load, and how much memory it holds, per precision.

The model is loaded from local safetensors with transformers' `from_pretrained` straight onto the
device (quantizing while loading for int8/nf4/fp4), as a fine-tune or a server loads it. A preset
is first written to a directory as safetensors (random weights: load time and memory depend only
on the shapes). By default the files are read once before the timed loads (a warm page cache, as
on a second load); `cache: cold` evicts them from the page cache before each load instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tunebench.config import LoadConfig
from tunebench.engine.model import count_params
from tunebench.environment import environment
from tunebench.errors import invalid
from tunebench.files import write_text
from tunebench.format import gib
from tunebench.inference import recorded, require_bitsandbytes, weights_for
from tunebench.launch.rundir import RunDir
from tunebench.metrics import telemetry
from tunebench.metrics.memory import current_rss_bytes, peak_memory, release, reset_peak
from tunebench.metrics.timer import synchronize
from tunebench.models import ModelSpec, load_meta_model, resolve_model
from tunebench.models.build import Weights, build, from_pretrained
from tunebench.models.save import save_pretrained
from tunebench.preflight import Plan, resolve_device
from tunebench.record import LoadMetrics, ResultRecord

Log = Callable[[str], None]


def preflight(cfg: LoadConfig) -> Plan:
    spec = resolve_model(cfg.model)
    if spec.path and not spec.has_weights:
        raise invalid("model", cfg.model, "the directory has no *.safetensors files to load")
    device = resolve_device(cfg.device)
    require_bitsandbytes(cfg.precisions)
    return Plan(cfg, device, spec)


@contextlib.contextmanager
def model_dir(spec: ModelSpec, cfg: LoadConfig, device: torch.device, log: Log) -> Iterator[Path]:
    """The directory to load from: the local model, or the preset written there as safetensors."""
    if spec.has_weights:
        yield spec.path
        return
    with contextlib.ExitStack() as stack:
        path = Path(cfg.workdir) if cfg.workdir else stack.enter_context(RunDir.temporary("tunebench-load-")).path
        if not (path / COMPLETE).is_file():
            log(f"load: writing {spec.name} (random bf16 weights) to {path}")
            _write_preset(spec, cfg, device, path)
        yield path


COMPLETE = ".tunebench-complete"  # written last: a directory without it holds a cut-off write


def _write_preset(spec: ModelSpec, cfg: LoadConfig, device: torch.device, path: Path) -> None:
    """The preset as safetensors in `path`, written aside first, so a killed write never looks complete."""
    path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=path))
    try:
        model, _ = build(spec, Weights(seed=cfg.seed, use_cache=True), device)
        save_pretrained(model, tmp)
        del model
        release(device)
        for f in tmp.iterdir():
            os.replace(f, path / f.name)
        write_text(path / COMPLETE, spec.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _page_cache(files: list[Path], cold: bool) -> None:
    """cold: drop the files' pages from the page cache; warm: read them once so they are all in it."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            if cold:
                os.fsync(fd)  # written pages must be clean before they can be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 64 * 2**20):
                    pass
        finally:
            os.close(fd)



def run_load(cfg: LoadConfig, log: Log) -> Iterator[ResultRecord]:
    """One record per precision, yielded as each load finishes."""
    plan = preflight(cfg)
    spec, device = plan.spec, plan.device
    env = environment(device)
    with model_dir(spec, cfg, device, log) as path:
        files = sorted(path.glob("*.safetensors"))
        disk = sum(f.stat().st_size for f in files)
        # One-time costs a second load would not pay: CUDA context, kernel libraries, model code import.
        torch.empty(1, device=device)
        load_meta_model(spec, weights_for("bf16", cfg))
        if cfg.cache == "warm":
            _page_cache(files, cold=False)
        for precision in cfg.precisions:
            yield _load_one(cfg, spec, path, files, disk, precision, device, env, log)


def _load_one(cfg: LoadConfig, spec: ModelSpec, path: Path, files: list[Path], disk: int, precision: str,
              device: torch.device, env: dict, log: Log) -> ResultRecord:
    config, h = cfg.record_config(precision=precision)
    m = LoadMetrics(precision=precision, disk_bytes=disk, cache=cfg.cache,
                    weights="safetensors" if spec.has_weights else "random")
    rec = ResultRecord(kind="load", config=config, config_hash=h, environment=env, tags=cfg.tag, metrics=m)
    if cfg.cache == "cold":
        _page_cache(files, cold=True)
    release(device)
    reset_peak(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    rss0 = current_rss_bytes()
    sampler = telemetry.start(device, cfg.telemetry)
    with recorded(rec, log, f"load {spec.name} {precision}"):
        t0 = time.perf_counter()
        model = from_pretrained(path, weights_for(precision, cfg), device)
        synchronize(device)
        m.load_s = time.perf_counter() - t0
        m.telemetry = sampler.stop() if sampler else None
        m.read_gbps = disk / m.load_s / 1e9
        m.model_bytes = model.get_memory_footprint()
        m.params_total = count_params(model)[0]
        if device.type == "cpu":  # safetensors maps the file: pages join the RSS only once read, so read them
            for p in model.parameters():
                torch.sum(p.data)
        rss1 = current_rss_bytes()
        m.rss_delta_bytes = rss1 - rss0 if rss0 is not None and rss1 is not None else None
        if device.type == "cuda":
            m.mem_allocated_bytes = torch.cuda.memory_allocated(device) - base
            m.mem_fraction = m.mem_allocated_bytes / torch.cuda.get_device_properties(device).total_memory
        for k, v in peak_memory(device).items():
            setattr(m, k, v)
        del model
        log(f"load {spec.name} {precision}: {m.load_s:.2f} s, "
            + (f"{gib(m.mem_allocated_bytes)} on the GPU" if m.mem_allocated_bytes is not None
               else f"{gib(m.model_bytes, '.3f')} of weights"))
    if sampler:  # after a failure the sampler is still running
        sampler.stop()
    release(device)
    return rec
