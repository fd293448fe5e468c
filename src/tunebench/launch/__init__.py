"""Launchers: where a run configuration executes.

A launcher takes a validated RunConfig and returns its ResultRecord (None when rank 0 ran on another
node); it never stores anything (tunebench.api finalizes and saves). Each is one file here:

    inprocess.InProcess   in this process (strategy single, one process)
    torchrun.Torchrun     under torchrun: local GPUs or processes, several nodes (ranks run launch/worker.py)
    isolated.Isolated     in a child process under a time limit (sweeps), which picks one of the above

They share the run-directory protocol of launch/rundir.py. A new launcher (Ray, SkyPilot) is one
more module with a `launch(cfg)` method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tunebench.config import RunConfig
    from tunebench.preflight import Plan
    from tunebench.record import ResultRecord


class Launcher(Protocol):
    def launch(self, cfg: RunConfig, plan: Plan | None = None, inputs: dict | None = None) -> ResultRecord | None:
        """Run `cfg` (`plan`: its preflight on this machine, if the caller has it) and return its record.
        A training job (a TrainConfig) comes with `inputs`: trainer.inputs.JobInputs as JSON."""


def launcher_for(cfg: RunConfig, progress: Any = None) -> Launcher:
    """Torchrun for distributed configurations, this process otherwise (`progress`: console.progress.run_progress
    or None for none; torchrun's ranks always log their progress lines)."""
    if cfg.distributed:
        from tunebench.launch.torchrun import Torchrun

        return Torchrun()
    from tunebench.launch.inprocess import InProcess

    return InProcess(progress)
