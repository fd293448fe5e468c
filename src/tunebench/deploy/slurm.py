"""An sbatch script: one task per node, `srun tunebench run ...`, c10d rendezvous on the first node.

User arguments are shell-quoted (shlex.quote), so bash passes them through literally; only the
script's own variables ($SLURM_NODEID, $head, $SLURM_JOB_ID) are expanded.
"""

from __future__ import annotations

import shlex

from tunebench.deploy import fields
from tunebench.deploy.command import RDZV_PORT, tunebench_argv
from tunebench.errors import UserError

LITERAL = ("$SLURM_NODEID", "${head}:" + str(RDZV_PORT), "$SLURM_JOB_ID")


def srun_argv(user_args: list[str], nodes: int, gpus: int, store: str | None) -> list[str]:
    return tunebench_argv(user_args, nodes, gpus, LITERAL[0], LITERAL[1], LITERAL[2], store)


def sbatch_script(user_args: list[str], nodes: int, gpus_per_node: int, job_name: str = "tunebench",
                  partition: str | None = None, time: str | None = None, store: str | None = None) -> str:
    fields.slurm_name(job_name)
    if partition is not None:
        fields.slurm_partition(partition)
    if time is not None:
        fields.slurm_time(time)
    if store is not None:
        fields.plain("store", store)
    argv = srun_argv(user_args, nodes, gpus_per_node, store)
    # Our own variables stay unquoted-but-double-quoted so bash expands them; user words are quoted.
    words = [f'"{a}"' if a in LITERAL else shlex.quote(a) for a in argv]
    lines = ["#!/usr/bin/env bash", f"#SBATCH --job-name={shlex.quote(job_name)}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={gpus_per_node}", "#SBATCH --exclusive",
             "#SBATCH --output=%x-%j.out"]
    if partition:
        lines.append(f"#SBATCH --partition={shlex.quote(partition)}")
    if time:
        lines.append(f"#SBATCH --time={shlex.quote(time)}")
    train = user_args[:1] == ["train"]
    if train:  # preempted or near its time limit: a checkpoint, then the job goes back in the queue
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=TERM@120"]
    lines += [
        "set -euo pipefail",
        "export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1",
        "# the c10d rendezvous is hosted by the first node of the allocation",
        # awk reads the whole list: under pipefail, `head -n 1` can end scontrol with SIGPIPE (exit 141)
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk "NR == 1")',
        "# one tunebench per node; it starts torchrun itself (node rank = the node's index in the job)",
        ("code=0; srun --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(words) + " || code=$?") if train
        else "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(words),
    ]
    if train:  # 75: stopped by a signal with its checkpoint saved; the requeued job resumes from it
        lines += ['if [ "$code" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi', 'exit "$code"']
    return "\n".join(lines) + "\n"


DEFINITION_END = "TUNEBENCH_SWEEP_DEFINITION"  # a line no JSON document can be (the JSON is one line)


def sweep_script(tasks, job_name: str = "tunebench", partition: str | None = None, time: str | None = None,
                 store: str | None = None, parallelism: int = 1) -> str:
    """A job array: task i runs the sweep's task i (a resumed sweep lists only the missing ones), at most
    `parallelism` at once; every task asks for the largest GPU count any configuration needs."""
    fields.slurm_name(job_name)
    for value, check in ((partition, fields.slurm_partition), (time, fields.slurm_time)):
        if value is not None:
            check(value)
    if store is not None:
        fields.plain("store", store)
    if parallelism < 1:
        raise UserError(f"invalid parallelism={parallelism}: must be at least 1")
    argv = ["tunebench", "sweep", "--definition", '"$definition"', "--index", "auto", "--print-result", "--store",
            shlex.quote(store or "tunebench-results/task-{index}.db")]  # tunebench fills in {index}
    lines = ["#!/usr/bin/env bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --array=0-{len(tasks.tasks) - 1}"
             f"%{parallelism}", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --gpus-per-node={max(tasks.gpus[e] for e, _ in tasks.tasks)}", "#SBATCH --output=%x-%A_%a.out"]
    lines += [f"#SBATCH --partition={partition}"] * bool(partition) + [f"#SBATCH --time={time}"] * bool(time)
    lines += ["set -euo pipefail", "export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1",
              f"# sweep {tasks.sweep_id}: {len(tasks.tasks)} tasks; the definition travels in this script",
              'definition=$(mktemp)', f"cat > \"$definition\" <<'{DEFINITION_END}'", tasks.definition_json(),
              DEFINITION_END, "srun --ntasks=1 " + " ".join(argv)]
    return "\n".join(lines) + "\n"
