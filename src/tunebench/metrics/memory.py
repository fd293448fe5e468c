"""Peak memory: the caching allocator's view, NVML's view (what other tools see), the host RSS."""

from __future__ import annotations

import gc
import resource
import sys

import torch

# The allocator's peaks before the timed steps (compile, warm-up, CUDA graphs' recording), per device index
_before_timed: dict[int, tuple[int, int]] = {}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        _before_timed.pop(_index(device), None)
        torch.cuda.reset_peak_memory_stats(device)


def mark_timed(device: torch.device) -> None:
    """The timed steps begin: the peaks so far are kept aside and the allocator's start anew, so that the steady
    state's can be told apart from the warm-up's (peak_memory)."""
    if device.type == "cuda":
        _before_timed[_index(device)] = (torch.cuda.max_memory_allocated(device),
                                         torch.cuda.max_memory_reserved(device))
        torch.cuda.reset_peak_memory_stats(device)


def graph_pool_bytes(device: torch.device) -> int:
    """Bytes held by CUDA graphs' private memory pools on `device`. A recorded graph's tensors live there, and
    its replays allocate nothing: the allocator's allocated figure no longer counts them, its reserved one does."""
    index = _index(device)
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if s.get("device", index) == index and tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


def peak_allocated(device: torch.device, graph_pools: bool = False) -> int:
    """The allocator's peak since the last reset_peak; with `graph_pools` (the step replays CUDA graphs) the
    timed steps' peak counts the graphs' pools in full, as if every tensor in them were alive (an upper bound:
    the replays hold that memory, whatever part of it is in use at the peak)."""
    steady = torch.cuda.max_memory_allocated(device) + (graph_pool_bytes(device) if graph_pools else 0)
    return max(steady, _before(device)[0])


def _before(device: torch.device) -> tuple[int, int]:
    """(allocated, reserved) peaks before the timed steps (mark_timed); zeros where none were marked."""
    return _before_timed.get(_index(device), (0, 0))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


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


def peak_memory(device: torch.device, graph_pools: bool = False) -> dict[str, int | None]:
    """Peaks since reset_peak (`graph_pools`: see peak_allocated)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, int | None] = {"peak_rss_bytes": rss if sys.platform == "darwin" else rss * 1024}
    if device.type == "cuda":
        out["peak_mem_allocated_bytes"] = peak_allocated(device, graph_pools)
        out["peak_mem_reserved_bytes"] = max(torch.cuda.max_memory_reserved(device), _before(device)[1])
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
