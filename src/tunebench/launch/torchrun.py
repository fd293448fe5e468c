"""Start a run under torchrun (torch.distributed.run, c10d rendezvous) and collect its record.

tunebench does no process spawning or rank arithmetic of its own: torchrun starts the ranks
(tunebench.launch.worker), restarts none of them, and ends all of them when one fails. If rank 0
left no record, this launcher makes one with status failed (or oom), the failing rank's error and
the figures of every rank that finished.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.environment import environment
from tunebench.launch.processes import run_torchrun, torchrun_env
from tunebench.launch.rundir import RunDir
from tunebench.metrics.aggregate import MEMORY, max_present
from tunebench.preflight import Plan, nproc_per_node
from tunebench.record import ResultRecord, TrainMetrics
from tunebench.run_preflight import preflight


def torchrun_argv(cfg: RunConfig, nproc: int, rundir: Path) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={cfg.nnodes}",
            "--max-restarts=0", "--monitor-interval=0.1"]  # a rank's exit seen within 0.1 s
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        argv.append("--standalone")  # a free local port, no fixed address to collide on
    else:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}",
                 f"--rdzv-id={cfg.rdzv_id or 'tunebench-' + cfg.config_hash()}", f"--node-rank={cfg.node_rank}",
                 f"--rdzv-conf=join_timeout={int(cfg.timeout)},is_host={int(cfg.node_rank == 0)}"]
    return argv + ["-m", "tunebench.launch.worker", str(rundir)]


@dataclass
class Torchrun:
    def launch(self, cfg: RunConfig, plan: Plan | None = None, inputs: dict | None = None) -> ResultRecord | None:
        """Run `cfg` under torchrun on this node. None when rank 0 ran (and recorded) on another node."""
        plan = plan or preflight(cfg)  # bad input fails here, before any process starts
        nproc = nproc_per_node(cfg, plan.device)
        with RunDir.temporary() as rundir:
            rundir.write_job({"config": cfg.model_dump(), "inputs": inputs})
            # a training job's ranks stop on SIGTERM with a checkpoint: pass the signal on, wait for them
            host_compute = plan.device.type == "cpu" or cfg.offload == "optimizer"
            code, tail = run_torchrun(torchrun_argv(cfg, nproc, rundir.path), torchrun_env(nproc, host_compute),
                                      forward=inputs is not None)
            if (text := rundir.result()) is not None:
                return ResultRecord.model_validate_json(text)
            if code == 0 or cfg.node_rank != 0:
                return None  # rank 0 ran on another node; on failure the first node's launcher records it, once
            return failed_record(cfg, rundir, tail, plan.device, plan.world_size)


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


def failed_record(cfg: RunConfig, rundir: RunDir, tail: list[str], device, world: int) -> ResultRecord:
    errors, ranks = rundir.errors(), rundir.ranks()
    cause = root_cause(tail)
    by_rank = {e["rank"]: e for e in errors}
    first = by_rank.get(cause["rank"]) if cause else None
    first = first or (min(errors, key=lambda e: e["rank"]) if errors else None)
    status = first["status"] if first else "failed"
    # torchrun's "why" is its own hint ("To enable traceback see ...") where the rank wrote no error file
    why = "" if not cause or cause["why"].startswith("To enable traceback") else f": {cause['why']}"
    head = (f"rank {cause['rank']} exited with code {cause['exitcode']}{why}" if cause
            else "torchrun ended without naming a failed rank")
    if first:
        error = f"{head}\nrank {first['rank']} reported:\n{first['error']}"
    else:  # killed by a signal before writing anything: torchrun's output is all there is
        error = f"{head}\n" + "".join(tail)[-3000:]
    m = TrainMetrics(world_size=world, nnodes=cfg.nnodes, per_rank=ranks or None)
    for k in MEMORY:
        setattr(m, k, max_present([getattr(r, k) for r in ranks]))
    return ResultRecord.for_config(cfg, environment(device), status=status, error=error, metrics=m)
