"""A sweep spread over a cluster: each configuration one task of a Kubernetes Indexed Job or a Slurm job array.

The sweep is expanded and checked here, registered in the local store (so `collect`, `results merge` and
`sweep --resume` assemble it), and its definition travels with the manifest (a ConfigMap) or the script (a
here-document): every task runs `tunebench sweep --definition FILE --index auto`, which reads its index from
JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID, runs that configuration, stores its record with the sweep's id
(one store file per task on a volume) and prints it between markers for `collect`. A resumed deployment
lists only the tasks whose configuration has fewer ok results than asked.

Configurations that need different GPU counts go to different Indexed Jobs (one per count), each pod
asking for what its configuration needs; a Slurm array asks every task for the largest count.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tunebench.errors import UserError


@dataclass
class SweepTasks:
    sweep_id: str
    name: str
    repeats: int
    entries: list  # suites.Entry
    tasks: list[tuple[int, int]]  # (entry, repeat) of each task to run
    gpus: list[int] = field(default_factory=list)  # GPUs each entry needs

    def groups(self) -> dict[int, list[int]]:
        """Task positions by the GPUs their configuration needs."""
        out: dict[int, list[int]] = {}
        for i, (e, _) in enumerate(self.tasks):
            out.setdefault(self.gpus[e], []).append(i)
        return dict(sorted(out.items()))

    def definition(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "name": self.name, "repeats": self.repeats,
                "entries": [{"name": e.name, "config": e.config.model_dump()} for e in self.entries],
                "tasks": [list(t) for t in self.tasks], "groups": {str(g): ix for g, ix in self.groups().items()}}

    def definition_json(self) -> str:
        return json.dumps(self.definition(), separators=(",", ":"))


def _gpus(cfg, default: int) -> int:
    if cfg.nnodes > 1:
        raise UserError(f"invalid sweep entry: nnodes={cfg.nnodes}; a deployed sweep runs each configuration on one "
                        "node (deploy a multi-node configuration on its own: tunebench deploy k8s --nodes N -- run)")
    return cfg.nproc_per_node or (1 if cfg.strategy == "single" else default)


def _check(entries: list, gpus: list[int]) -> None:
    """Each configuration as `run` checks it on the cluster (strategy, world size, positions)."""
    from tunebench.models.spec import resolve_model
    from tunebench.strategies import STRATEGIES

    for e, g in zip(entries, gpus):
        cfg = e.config.model_copy(update={"device": "cuda", "nproc_per_node": g})
        try:
            STRATEGIES[cfg.strategy].check(cfg, g, packages=False)
            if not any(c in cfg.model for c in "/~."):
                spec = resolve_model(cfg.model)
                if spec.max_positions and cfg.seq_len > spec.max_positions:
                    raise UserError(f"invalid seq_len={cfg.seq_len}: above {spec.max_positions} positions")
        except UserError as err:
            raise UserError(f"suite entry '{e.name}': {err}") from None


# what a ConfigMap carries (1 MiB in all, its metadata too); the Slurm script carries the same definition
MAX_DEFINITION_BYTES = 1_000_000


def plan(suite: str | None, sets: dict[str, Any], repeats: int | None, store: str | Path, resume: str | None,
         default_gpus: int) -> SweepTasks:
    """A new sweep (expanded, checked, registered in `store`) or the missing tasks of a registered one."""
    from tunebench.store import Store, check_store
    from tunebench.suites import definition, expand, from_definition, load_suite

    if resume:
        if not Path(store).is_file():
            raise UserError(f"no sweep with id {resume!r} in {store}: there is no results store there")
        with Store(store, create=False) as s:
            name, entries, registered = from_definition(s.sweep(resume))
            done = s.ok_counts(resume)
        n = repeats or registered
        tasks = [(i, k) for i, e in enumerate(entries) for k in range(done.get(e.config.config_hash(), 0), n)]
        out = SweepTasks(resume, name, n, entries, tasks)
    else:
        if not suite:
            raise UserError("give --sweep SUITE (a built-in name or a YAML file), or --resume SWEEP_ID")
        data = load_suite(suite)
        name = str(data.get("name") or Path(suite).stem)
        entries, n = expand(data, sets), repeats or 1
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        sweep_id = f"{''.join(c if c.isalnum() else '-' for c in name)[:24]}-{stamp}-{secrets.token_hex(2)}"
        out = SweepTasks(sweep_id, name, n, entries, [(i, k) for i in range(len(entries)) for k in range(n)])
    out.gpus = [_gpus(e.config, default_gpus) for e in out.entries]
    _check(out.entries, out.gpus)
    size = len(out.definition_json().encode())
    if size > MAX_DEFINITION_BYTES:  # checked before the sweep is registered or any manifest written
        raise UserError(f"the sweep's definition is {size:,} bytes ({len(out.entries):,} configurations): a "
                        f"Kubernetes ConfigMap holds at most {MAX_DEFINITION_BYTES:,}; split the suite (fewer axes "
                        "or values per file)")
    if not resume:
        check_store(store)
        with Store(store) as s:
            s.save_sweep(out.sweep_id, out.name, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         definition(out.name, out.entries, out.repeats))
    return out


def task_argv(definition_path: str, group: int | None, store: str | None) -> list[str]:
    """The command of one task; `{index}` in the store path becomes the task's index."""
    argv = ["tunebench", "sweep", "--definition", definition_path, "--index", "auto", "--print-result"]
    if group is not None:
        argv += ["--group", str(group)]
    return argv + (["--store", store] if store else ["--no-store"])
