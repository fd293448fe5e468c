"""Deployment: the same tunebench command wrapped for Kubernetes (JobSet, Indexed Job, TrainJob) and Slurm.

`k8s_text` and `slurm_text` are what `tunebench deploy` writes: every value checked for its field, the
tunebench arguments checked as `run` would check them on the cluster, and the result validated (the
manifests against their schemas, the script by `bash -n`) before a byte is written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from tunebench.errors import UserError


def k8s_text(job) -> str:
    from tunebench.deploy.command import check_user_args
    from tunebench.deploy.k8s import _check, manifests, to_yaml

    _check(job)
    check_user_args(job.user_args, job.nodes, job.gpus_per_node)
    docs = manifests(job)
    for doc in docs:
        check_manifest(doc)
    return to_yaml(docs)


def slurm_text(user_args: list[str], nodes: int, gpus: int, job_name: str, partition: str | None,
               time: str | None, store: str | None) -> str:
    from tunebench.deploy.command import check_user_args
    from tunebench.deploy.slurm import sbatch_script

    text = sbatch_script(user_args, nodes, gpus, job_name, partition, time, store)  # checks the fields
    check_user_args(user_args, nodes, gpus)
    _bash_n(text)
    return text


def check_manifest(doc: dict) -> None:
    """Refuse a manifest Kubernetes would reject (validated offline; see deploy/validate.py)."""
    from tunebench.deploy.validate import validate

    try:
        validate(doc)
    except ImportError:  # the validators are the [deploy] extra; the field checks above still ran
        print("tunebench: note: manifests not validated against the Kubernetes schemas "
              "(pip install 'tunebench[deploy]' to validate them offline)", file=sys.stderr)
    except Exception as err:
        first = str(getattr(err, "message", None) or err).strip().splitlines()[0][:300]
        raise UserError(f"the generated {doc.get('kind')} is not valid for Kubernetes: {first}") from None


def sweep_tasks(suite, sets, repeats, store, resume, default_gpus):
    from tunebench.deploy.sweep import plan

    return plan(suite, sets, repeats, store, resume, default_gpus)


def k8s_sweep_text(job, tasks, parallelism: int) -> str:
    from tunebench.deploy.k8s import sweep_manifests, to_yaml

    if not tasks.tasks:
        raise UserError(f"sweep {tasks.sweep_id} has an ok result for every configuration: nothing to deploy")
    docs = sweep_manifests(job, tasks, parallelism)
    for doc in docs:
        check_manifest(doc)
    return to_yaml(docs)


def slurm_sweep_text(tasks, job_name, partition, time, store, parallelism: int) -> str:
    from tunebench.deploy.slurm import sweep_script

    if not tasks.tasks:
        raise UserError(f"sweep {tasks.sweep_id} has an ok result for every configuration: nothing to deploy")
    text = sweep_script(tasks, job_name, partition, time, store, parallelism)
    _bash_n(text)
    return text


def _bash_n(text: str) -> None:
    bash = shutil.which("bash")
    if bash:
        p = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
        if p.returncode != 0:
            raise UserError(f"the generated script does not parse: {p.stderr.strip().splitlines()[0]}")
