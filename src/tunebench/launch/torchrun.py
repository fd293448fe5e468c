"""Start a run under torchrun (torch.distributed.run, c10d rendezvous) and collect its record.

tunebench does no process spawning or rank arithmetic of its own: torchrun starts the ranks
(tunebench.launch.worker), restarts none of them, and ends all of them when one fails. If rank 0
left no record, this launcher writes one with status failed (or oom), the failing rank's error and
the figures of every rank that finished.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.environment import environment
from tunebench.metrics.aggregate import MEMORY, max_present
from tunebench.record import ResultRecord, TrainMetrics
from tunebench.runner import nproc_per_node, preflight
from tunebench.store import Store


def torchrun_argv(cfg: RunConfig, nproc: int, rundir: Path) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={cfg.nnodes}",
            "--max-restarts=0", "--monitor-interval=0.5"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        argv.append("--standalone")  # a free local port, no fixed address to collide on
    else:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}",
                 f"--rdzv-id={cfg.rdzv_id or 'tunebench-' + cfg.config_hash()}", f"--node-rank={cfg.node_rank}",
                 f"--rdzv-conf=join_timeout={int(cfg.timeout)},is_host={int(cfg.node_rank == 0)}"]
    return argv + ["-m", "tunebench.launch.worker", str(rundir)]


def torchrun_env(nproc: int, cpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cpu:  # share the cores between the ranks instead of oversubscribing them
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def launch(cfg: RunConfig, store: str | Path | None, sweep_id: str | None = None,
           scaling_baseline: dict | None = None, record_id: str | None = None) -> ResultRecord | None:
    """Run `cfg` under torchrun on this node. Returns the record, or None when rank 0 ran on another node."""
    plan = preflight(cfg)  # bad input fails here, before any process starts
    nproc = nproc_per_node(cfg, plan.device)
    rundir = Path(tempfile.mkdtemp(prefix="tunebench-run-"))
    try:
        job = {"config": cfg.model_dump(), "store": str(store) if store else None, "sweep_id": sweep_id,
               "scaling_baseline": scaling_baseline, "record_id": record_id}
        (rundir / "job.json").write_text(json.dumps(job))
        code, tail = run_torchrun(torchrun_argv(cfg, nproc, rundir), torchrun_env(nproc, plan.device.type == "cpu"))
        result = rundir / "result.json"
        if result.exists():
            return ResultRecord.model_validate_json(result.read_text())
        if code == 0 or cfg.node_rank != 0:
            return None  # rank 0 ran on another node; on failure the first node's launcher records it, once
        rec = failed_record(cfg, rundir, tail, plan.device, nproc * cfg.nnodes, sweep_id)
        if record_id:
            rec.id = record_id
        if store:
            with Store(store) as s:
                s.save(rec)
        return rec
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def die_with_parent() -> None:
    """In a child, before exec: get SIGKILL if this process dies, so no run outlives a killed sweep."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: children may outlive a killed parent
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def run_torchrun(argv: list[str], env: dict[str, str], timeout: float | None = None) -> tuple[int, list[str]]:
    """Run torchrun, echoing its output to stderr; returns its exit code and last lines.

    After `timeout` seconds torchrun and every rank are killed (the last line then says so).
    """
    tail: collections.deque[str] = collections.deque(maxlen=120)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, bufsize=1, preexec_fn=die_with_parent)
    timer = threading.Timer(timeout, _kill_group, (proc.pid,)) if timeout else None
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
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        if timer:
            timer.cancel()
    return proc.returncode, list(tail)


TEARDOWN = -15  # SIGTERM: how torchrun ends the ranks that survived the first failure


def root_cause(tail: list[str]) -> dict | None:
    """The rank that failed first, from torchrun's failure summary.

    torchrun names a 'Root Cause' by timestamps of one-second resolution, so when a rank is killed
    the survivors' own errors (which torchrun then ends with SIGTERM) can be named instead. A rank
    that died of any other signal is the cause; otherwise torchrun's choice stands.
    """
    text = "".join(tail)
    at = text.rfind("Failures:")
    at = at if at >= 0 else text.rfind("Root Cause")
    if at < 0:
        return None
    entries = []
    for m in re.finditer(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+).*?traceback\s*:\s*([^\n]*)", text[at:], re.S):
        entries.append({"rank": int(m.group(1)), "exitcode": int(m.group(2)), "why": m.group(3).strip()})
    if not entries:
        return None
    killed = [e for e in entries if e["exitcode"] < 0 and e["exitcode"] != TEARDOWN]
    if killed:
        return killed[0]
    named = text.rfind("Root Cause")
    first = re.search(r"rank\s*:\s*(\d+)", text[named:]) if named >= 0 else None
    return next((e for e in entries if first and e["rank"] == int(first.group(1))), entries[0])


def failed_record(cfg: RunConfig, rundir: Path, tail: list[str], device, world: int,
                  sweep_id: str | None) -> ResultRecord:
    errors = [json.loads(p.read_text()) for p in sorted(rundir.glob("error-rank-*.txt"))]
    ranks = [json.loads(p.read_text()) for p in sorted(rundir.glob("rank-*.json"))]
    cause = root_cause(tail)
    by_rank = {e["rank"]: e for e in errors}
    first = by_rank.get(cause["rank"]) if cause else None
    first = first or (min(errors, key=lambda e: e["rank"]) if errors else None)
    status = first["status"] if first else "failed"
    head = (f"rank {cause['rank']} exited with code {cause['exitcode']}: {cause['why']}" if cause
            else "torchrun ended without naming a failed rank")
    if first:
        error = f"{head}\nrank {first['rank']} reported:\n{first['error']}"
    else:  # killed by a signal before writing anything: torchrun's output is all there is
        error = f"{head}\n" + "".join(tail)[-3000:]
    m = TrainMetrics(world_size=world, nnodes=cfg.nnodes, per_rank=[
        {k: v for k, v in r.items() if k != "step_times"} for r in ranks] or None)
    for k in MEMORY:
        setattr(m, k, max_present([r.get(k) for r in ranks]))
    return ResultRecord(config=cfg.model_dump(), config_hash=cfg.config_hash(), environment=environment(device),
                        tags=cfg.tag, status=status, error=error, sweep_id=sweep_id, metrics=m)
