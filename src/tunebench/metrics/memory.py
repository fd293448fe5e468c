"""Peak memory: the caching allocator's view, NVML's view (what other tools see), the host RSS."""

from __future__ import annotations

import gc
import resource
import sys

import torch


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def nvml_used_bytes(device: torch.device) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no NVML, or a GPU index NVML numbers differently
        return None


def peak_memory(device: torch.device) -> dict[str, int | None]:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, int | None] = {"peak_rss_bytes": rss if sys.platform == "darwin" else rss * 1024}
    if device.type == "cuda":
        out["peak_mem_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_mem_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        out["nvml_mem_used_bytes"] = nvml_used_bytes(device)
    return out


def current_rss_bytes() -> int | None:
    """Resident memory of this process now (Linux), to measure what one step added."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None


def available_host_bytes() -> int | None:
    """Memory the kernel says a new allocation can get without swapping (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def release(device: torch.device) -> None:
    """Free what the last model left: Python garbage, then the allocator's cached blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
