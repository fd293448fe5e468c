"""Child processes that never outlive their parent, and torchrun with its output echoed and a time limit."""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child (before exec, or first thing in a worker): SIGKILL when the parent dies.

    Each process of a run (sweep -> run -> torchrun -> ranks) sets this, so killing the top of the
    chain, even with SIGKILL, ends every process below it. A parent that died before this call left
    the process to init (or a subreaper): then it ends at once.
    """
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: children may outlive a killed parent
        return
    if parent == 1 or os.getppid() != parent:
        os._exit(1)


def exit_now(code: int) -> None:
    """End a run's process once its results are written: exit handlers run, streams flushed, then the
    interpreter's teardown skipped. With torch and transformers loaded that teardown (freeing every
    module) is slow, and every rank and run pays it."""
    # first what the interpreter's own exit does first: the threading module's exit hooks (which stop executors'
    # idle workers), then every non-daemon thread joined (a library's upload still writing finishes)
    if threading.current_thread() is threading.main_thread():
        threading._shutdown()
    atexit._run_exitfuncs()  # what libraries registered (trackers' flushes, compile worker pools) still runs
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # already gone
        pass


def torchrun_env(nproc: int, host_compute: bool) -> dict[str, str]:
    """`host_compute`: the ranks compute on the host (CPU runs, an offloaded optimizer), where torchrun would
    leave each one thread."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if host_compute:  # share the cores between the ranks instead of oversubscribing them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


@dataclass
class Finished:
    code: int  # the exit code (negative: the signal that ended it)
    timed_out: bool  # it ran past its time limit and its whole group was killed
    tail: list[str]  # the last lines of its output (stdout and stderr together)


@contextlib.contextmanager
def forwarded_signals(pid: int) -> Iterator[None]:
    """SIGTERM and SIGINT to this process are passed on to `pid` (torchrun, which passes them to its ranks)
    instead of ending this process: a training job's ranks then checkpoint and stop on their own."""
    forward = lambda signum, frame: os.kill(pid, signum)  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_group(argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None,
              echo: bool | Callable[[str], bool] = False, keep: int = 120, forward: bool = False) -> Finished:
    """Run `argv` in a process group of its own that dies with this process, keeping its last `keep` lines
    of output (echoed to stderr with `echo`: every line, or those it accepts). After `timeout` seconds, or when
    this process is interrupted, the whole group is killed: the process, torchrun, every rank. With `forward`,
    SIGTERM and SIGINT are passed on to it instead (see forwarded_signals)."""
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, bufsize=1, preexec_fn=die_with_parent, errors="replace")

    def read() -> None:
        for line in proc.stdout:
            if echo is True or (callable(echo) and echo(line)):
                sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    try:
        with forwarded_signals(proc.pid) if forward else contextlib.nullcontext():
            proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()
        timed_out = True
    except BaseException:  # Ctrl-C: end the group, politely first, then stop
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
        raise
    reader.join(timeout=10)
    if timed_out:
        tail.append(f"killed after the {timeout:g} s time limit\n")
    return Finished(proc.returncode, timed_out, list(tail))


def run_torchrun(argv: list[str], env: dict[str, str], timeout: float | None = None,
                 forward: bool = False) -> tuple[int, list[str]]:
    """Run torchrun, echoing its output to stderr; returns its exit code and last lines."""
    done = run_group(argv, env, timeout, echo=True, forward=forward)
    return done.code, done.tail
