"""Activation offload: what the forward saves for backward waits in pinned host memory, copied both ways on
side streams so that the copies overlap the compute.

With whole-block checkpointing (`grad_ckpt`) a compiled block saves only its input: one (batch, seq, hidden)
tensor per block, 1 GiB on Mistral-7B at batch 8 x 512, a large share of the whole QLoRA step's peak. Offloaded,
those inputs cost PCIe time the forward and backward hide (a block's input crosses the link in less time than the
block computes) instead of GPU memory. Offloading everything a block keeping its matmuls saves is possible too, but
many times the bytes: bounded by the host link, not the GPU.

How (saved-tensor hooks around the forward, as torchtune's OffloadActivations):
- pack: a saved tensor (CUDA, contiguous, not a parameter, at least `min_bytes`) becomes an entry; the same
  tensor saved again (the rotary tables every block saves) is the same entry. An entry's copy to the host starts
  only once `LAG` newer entries exist: the last ones saved are the first backward needs, and stay.
- the copy runs on a side stream after the compute that made the tensor; the caching allocator is told the tensor
  is in use there (record_stream), so its memory is reused as soon as the copy is done, not before.
- the host waits for the oldest copy beyond `IN_FLIGHT`: the allocator reuses memory freed across streams only
  once it sees the copy done, so a host far ahead of the GPU would otherwise hold everything (and a link slower
  than the compute makes the forward wait rather than hold more).
- unpack (backward, newest first): an entry still on the GPU is handed back; an offloaded one is copied back on
  a second stream into memory allocated in the compute's order, and the `PREFETCH` entries before it are started
  too, so that each block's input arrives while the block after it computes its backward.
- host memory: buffers of the tensors' exact sizes, page-locked once (cudaHostRegister) and reused step after step.
  torch's pinned allocator rounds every block up to a power of two: at long context a block's input (2.8 GB at
  342k tokens of an 8B model) would hold 4 GiB of host memory.
On the CPU the copies are plain clones (nothing to save there; the same bookkeeping runs, which the tests check).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

LAG = 2  # the newest entries stay on the GPU (backward needs them first)
PREFETCH = 2  # entries copied back ahead of the one backward asks for
MIN_BYTES = 1 << 20  # smaller saved tensors stay (not worth a copy's launch)
IN_FLIGHT = 2  # copies to the host under way before the host waits for the oldest


class HostPool:
    """Page-locked host buffers of exact sizes (bytes), reused: taken by a copy to the host, given back when the
    step that used them is over; one not taken again in the step after is released. Each buffer is a mapping of its
    own pages (mmap): registering memory that shares a page with a registered neighbour (malloc's heap) fails."""

    def __init__(self) -> None:
        self.free: dict[int, list[torch.Tensor]] = collections.defaultdict(list)  # bytes -> uint8 buffers
        self.lent: dict[int, torch.Tensor] = {}  # address -> the buffer behind a tensor taken
        self.last_taken: dict[int, int] = {}  # address -> the step that last took it
        self.step = 0

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = shape.numel() * dtype.itemsize
        free = self.free[nbytes]
        buf = free.pop() if free else self._new(nbytes)
        self.lent[buf.data_ptr()] = buf
        self.last_taken[buf.data_ptr()] = self.step
        return buf.view(dtype).view(shape)

    def give(self, t: torch.Tensor) -> None:
        buf = self.lent.pop(t.data_ptr())
        self.free[buf.numel()].append(buf)

    def next_step(self) -> None:
        """A new step: buffers no step took since the one before are released (shapes that changed)."""
        self.step += 1
        for nbytes, bufs in self.free.items():
            stale = [b for b in bufs if self.last_taken[b.data_ptr()] < self.step - 1]
            for b in stale:  # dropped: unregistered as it is freed
                del self.last_taken[b.data_ptr()]
            self.free[nbytes] = [b for b in bufs if b.data_ptr() in self.last_taken]

    def _new(self, nbytes: int) -> torch.Tensor:
        buf = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)  # the tensor keeps the mapping alive
        cudart = torch.cuda.cudart()
        if cudart.cudaHostRegister(buf.data_ptr(), nbytes, 0) != cudart.cudaError.success:
            _clear_cuda_error()  # else the next kernel launch's check reports it
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)  # torch's pinned allocator
        weakref.finalize(buf, cudart.cudaHostUnregister, buf.data_ptr())  # before the mapping goes
        return buf


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error (torch binds no cudaGetLastError): through the libcudart this process
    loaded."""
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "libcudart.so" in line), None)
        if path:
            ctypes.CDLL(path).cudaGetLastError()
    except OSError:
        pass


@dataclass
class _Entry:
    index: int
    gpu: torch.Tensor | None  # the tensor while it is on the device
    uses: int = 1  # saves of this storage not yet unpacked
    version: int = 0  # its version counter when saved: an in-place change before the copy is an error
    host: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None  # the copy to the host is done
    back: torch.Tensor | None = None  # copied back for backward
    arrived: torch.cuda.Event | None = None


class ActivationOffload:
    """Saved-tensor hooks that keep a step's saved activations in host memory between forward and backward."""

    def __init__(self, device: torch.device, params: Iterable[torch.Tensor], min_bytes: int | None = None):
        self.cuda = device.type == "cuda"
        if self.cuda and device.index is None:  # compared with the saved tensors' devices, which carry one
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.min_bytes = device, MIN_BYTES if min_bytes is None else min_bytes
        self.streams = (torch.cuda.Stream(device), torch.cuda.Stream(device)) if self.cuda else None
        # weights are saved for backward too (a matmul's): never copied, whatever view of them was saved
        self.param_storages = {p.untyped_storage().data_ptr() for p in params}
        self.entries: list[_Entry] = []
        # a tensor saved again (by identity: once offloaded, its memory may hold another one at the same address)
        self.seen: dict[int, tuple[weakref.ref, _Entry]] = {}
        self.offloaded_bytes = 0  # this step's, for the tests and the curious
        self.in_flight: collections.deque[_Entry] = collections.deque()
        self.host = HostPool() if self.cuda else None

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """One forward's saves (a new step: the previous one's entries are done with)."""
        if self.cuda:  # a copy back never unpacked still writes memory the compute stream may reuse
            current = torch.cuda.current_stream(self.device)
            for e in self.entries:
                if e.back is not None:
                    current.wait_event(e.arrived)
                if e.host is not None:  # its copies are queued before anything the next step copies into it
                    self.host.give(e.host)
                    e.host = None  # a graph retained past this forward has lost it (_unpack says so)
            self.host.next_step()
        self.entries, self.seen, self.offloaded_bytes, self.in_flight = [], {}, 0, collections.deque()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def _pack(self, t: torch.Tensor) -> torch.Tensor | _Entry:
        if (t.device != self.device or not t.is_contiguous() or t.numel() * t.element_size() < self.min_bytes
                or t.untyped_storage().data_ptr() in self.param_storages):
            return t
        seen = self.seen.get(id(t))
        if seen is not None and seen[0]() is t and seen[1].version == t._version:  # this very tensor, saved again
            seen[1].uses += 1
            return seen[1]
        e = _Entry(len(self.entries), t, version=t._version)
        self.entries.append(e)
        self.seen[id(t)] = (weakref.ref(t), e)
        if e.index >= LAG:
            self._offload(self.entries[e.index - LAG])
        return e

    def _offload(self, e: _Entry) -> None:
        t = e.gpu
        if t is None:
            return
        if t._version != e.version:
            raise RuntimeError("a tensor saved for backward was modified in place before its copy to the host")
        if self.cuda:
            d2h, _ = self.streams
            d2h.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(d2h):
                e.host = self.host.take(t.shape, t.dtype)
                e.host.copy_(t, non_blocking=True)
                e.copied = torch.cuda.Event()
                e.copied.record()
            t.record_stream(d2h)  # its memory is free again once the copy is done
            # the host waits for the oldest copies beyond IN_FLIGHT: the allocator reuses a tensor's memory only
            # once it has seen its copy done, and a host running ahead of the GPU would see none done (memory
            # would grow as without offloading); also where the link is slower than the compute, the forward
            # waits for it rather than hold more
            self.in_flight.append(e)
            while len(self.in_flight) > IN_FLIGHT:
                self.in_flight.popleft().copied.synchronize()
        else:
            e.host = t.clone()
        e.gpu = None
        self.offloaded_bytes += t.numel() * t.element_size()

    def _fetch(self, e: _Entry) -> None:
        if e.gpu is not None or e.back is not None or e.host is None:
            return
        if self.cuda:
            # allocated in the compute stream's order (no cross-stream free to wait for: the compute waits for the
            # copy before its first use); the copy stream first waits for what the compute has queued, which may
            # still use that memory
            _, h2d = self.streams
            e.back = torch.empty(e.host.shape, dtype=e.host.dtype, device=self.device)
            h2d.wait_stream(torch.cuda.current_stream(self.device))
            h2d.wait_event(e.copied)
            with torch.cuda.stream(h2d):
                e.back.copy_(e.host, non_blocking=True)
                e.arrived = torch.cuda.Event()
                e.arrived.record()
        else:
            e.back = e.host

    def _unpack(self, e: torch.Tensor | _Entry) -> torch.Tensor:
        if isinstance(e, torch.Tensor):
            return e
        for earlier in self.entries[max(0, e.index - PREFETCH):e.index]:
            if earlier.uses:  # not those already used up
                self._fetch(earlier)
        if e.gpu is not None:
            t = e.gpu
        else:
            if e.host is None:
                raise RuntimeError("an activation kept on the device for backward was unpacked again after its last "
                                   "use: a second backward through one forward (retain_graph) is not supported with "
                                   "offload=activations")
            self._fetch(e)
            t = e.back
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(e.arrived)
        e.uses -= 1
        if e.uses == 0:  # every save of it unpacked: its device copy goes (the host one stays until the next
            e.gpu = e.back = None  # forward, for a backward that unpacks it again: retain_graph)
        return t


def activation_offload(offload: str, device: torch.device, module: torch.nn.Module):
    """The context a forward runs in: offloading its saves when `offload` is "activations", else nothing."""
    if offload != "activations":
        return contextlib.nullcontext
    return ActivationOffload(device, _persistent(module)).forward


def _persistent(module: torch.nn.Module) -> list[torch.Tensor]:
    """What the model holds across steps (a matmul saves its weight): parameters, buffers and the 4-bit weights'
    quantization constants (bitsandbytes keeps them beside the parameter, not as buffers)."""
    out = list(module.parameters()) + list(module.buffers())
    for p in module.parameters():
        qs = getattr(p, "quant_state", None)
        while qs is not None:  # the absmax of a nested quantization has its own state
            out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
            qs = getattr(qs, "state2", None)
    return out
