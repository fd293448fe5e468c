"""What produced a result: GPUs, driver, CUDA, library versions, CPU, host, tunebench commit."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "accelerate", "pydantic", "liger-kernel")


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"name": None, "count": 0, "memory_bytes": None, "capability": None}
    props = torch.cuda.get_device_properties(device)
    return {"name": props.name, "count": torch.cuda.device_count(), "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}", "index": device.index,
            "uuid": str(getattr(props, "uuid", "")) or None,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def environment(device: torch.device) -> dict:
    from tunebench import __version__

    return {
        "device": device.type,
        "gpu": gpu_info(device),
        "driver": _driver_version() if device.type == "cuda" else None,
        "cuda": torch.version.cuda,
        "versions": {p: _version(p) for p in PACKAGES} | {"python": platform.python_version()},
        "cpu": {"model": _cpu_model(), "cores": os.cpu_count()},
        "host": {"hostname": socket.gethostname(), "platform": platform.platform()},
        "tunebench": {"version": __version__, "git_commit": _git_commit()},
    }
