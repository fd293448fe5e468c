"""Memory bandwidths: device memory (a copy counts its read and its write) and host <-> device.

Device copy: dst.copy_(src) of one buffer, bandwidth = 2 x bytes / time (every byte is read once and
written once). Host <-> device: bytes / time, from pinned (page-locked) host memory, which the GPU
reads directly, and from pageable memory, which the driver stages through a pinned buffer. On CPU
the copy is a memcpy between two host buffers and there is no host <-> device. GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import statistics

import torch

from tunebench.metrics.timer import time_calls


def _summary(times: list[float], nbytes: int, moved: int) -> dict:
    return {"bytes": nbytes, "iters": len(times), "gbps": moved / statistics.median(times) / 1e9,
            "best_gbps": moved / min(times) / 1e9, "mean_gbps": moved / statistics.fmean(times) / 1e9}


def device_copy(device: torch.device, nbytes: int, iters: int, warmup: int) -> dict:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return _summary(time_calls(lambda: dst.copy_(src), device, iters, warmup), nbytes, 2 * nbytes)


def host_transfers(device: torch.device, nbytes: int, iters: int, warmup: int) -> list[dict]:
    """h2d and d2h, each from pinned and from pageable host memory."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    rows = []
    for pinned in (True, False):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).fill_(1)
        for direction, call in (("h2d", lambda h=host, p=pinned: dev.copy_(h, non_blocking=p)),
                                ("d2h", lambda h=host, p=pinned: h.copy_(dev, non_blocking=p))):
            times = time_calls(call, device, iters, warmup)
            rows.append({"direction": direction, "memory": "pinned" if pinned else "pageable",
                         **_summary(times, nbytes, nbytes)})
    return rows
