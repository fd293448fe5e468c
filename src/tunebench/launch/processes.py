"""Child processes that never outlive their parent, and torchrun with its output echoed and a time limit."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child (before exec, or first thing in a worker): SIGKILL when the parent dies.

    Each process of a run (sweep -> run -> torchrun -> ranks) sets this, so killing the top of the
    chain, even with SIGKILL, ends every process below it.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: children may outlive a killed parent
        pass


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # already gone
        pass


def torchrun_env(nproc: int, cpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cpu:  # share the cores between the ranks instead of oversubscribing them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def run_torchrun(argv: list[str], env: dict[str, str], timeout: float | None = None) -> tuple[int, list[str]]:
    """Run torchrun, echoing its output to stderr; returns its exit code and last lines.

    After `timeout` seconds torchrun and every rank are killed (the last line then says so).
    """
    tail: collections.deque[str] = collections.deque(maxlen=120)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, bufsize=1, preexec_fn=die_with_parent)
    timer = threading.Timer(timeout, kill_group, (proc.pid,)) if timeout else None
    if timer:
        timer.start()
    try:
        for line in proc.stdout:
            sys.stderr.write(line)
            tail.append(line)
        proc.wait()
        if timer and not timer.is_alive():
            tail.append(f"killed after the {timeout:.0f} s time limit\n")
    except BaseException:  # Ctrl-C or the caller's timeout: end torchrun and every rank with it
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
        raise
    finally:
        if timer:
            timer.cancel()
    return proc.returncode, list(tail)
