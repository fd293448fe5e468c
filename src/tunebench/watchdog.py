"""A rank's watchdog: a distributed run whose rank makes no progress for `timeout` seconds is ended, every rank.

The collective timeout ends a rank that waits in a collective for a peer that never comes. It cannot end ranks
that are all stuck elsewhere (a data source, a file system, a deadlock in Python code), and a stuck rank holds
its own process open whatever its peers do. So each rank beats at every step (engine.loop) and through the long
phases between steps (evaluation); a daemon thread that sees no beat for `timeout` seconds says where the rank's
main thread is, hands that to the caller (which records it), and ends the process. torchrun then ends every
other rank, as it does after any rank's failure.

The watch starts at the first beat after `watching()` begins and rests from `rest()` until the next beat, so the
phases whose length the step timeout cannot bound (building the model, the first compiled step, writing the
trained model) are not watched: their collectives keep their own timeout.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

_last: float | None = None  # monotonic time of the last beat; None while resting
_on = False  # inside watching()


def beat() -> None:
    """Progress: the watch (re)starts from now. Free outside `watching()`."""
    global _last
    if _on:
        _last = time.monotonic()


def rest() -> None:
    """Stop the watch until the next beat (a phase the step timeout does not bound comes next)."""
    global _last
    _last = None


def where(thread_id: int | None = None) -> str:
    """The innermost frames of `thread_id` (default the main thread) as 'file:line in function' steps."""
    frame = sys._current_frames().get(thread_id or threading.main_thread().ident)
    if frame is None:
        return "unknown"
    stack = traceback.extract_stack(frame)[-3:]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in reversed(stack))


@contextlib.contextmanager
def watching(timeout_s: float, name: str, on_fire: Callable[[str], None]) -> Iterator[None]:
    """Watch this process while the block runs. `on_fire(message)` runs (in the watchdog's thread) before the
    process exits with status 1; `name` says whose process it is ('rank 1')."""
    global _on
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(min(5.0, timeout_s / 4)):
            last = _last
            if last is None or time.monotonic() - last < timeout_s:
                continue
            message = (f"{name} made no progress for {timeout_s:g} s (the `timeout` limit), stuck at {where()}: "
                       "every rank of the run was ended")
            with contextlib.suppress(BaseException):
                on_fire(message)
            with contextlib.suppress(BaseException):
                print(f"tunebench: {message}", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # every thread's stack, for the log
            os._exit(1)

    _on = True
    rest()
    thread = threading.Thread(target=watch, name="tunebench-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        _on = False
        rest()
        stop.set()
