"""Metrics to TensorBoard, MLflow (a local file store in output_dir) and/or Weights & Biases, through their own
libraries. A tracker is a convenience: one that fails, at its start or mid-run, is dropped with one warning line
and the job goes on (its record is tunebench's own)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunebench.console import say
from tunebench.errors import require

INSTALL = {"tensorboard": ("tensorboard", "pip install tensorboard"),
           "mlflow": ("mlflow", "pip install mlflow-skinny"),
           "wandb": ("wandb", "pip install wandb")}


def check(trackers: list[str]) -> None:
    """A tracker's package missing is bad input, refused before any work (not a warning after the data)."""
    for t in trackers:
        module, install = INSTALL[t]
        require(module, f"track={t}", install)


class _TensorBoard:
    def __init__(self, out: Path, run_name: str, params: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.location = str((out / "tensorboard").resolve())
        self.writer = SummaryWriter(log_dir=self.location)

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, out: Path, run_name: str, params: dict[str, Any]):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the local file store, no server
        import mlflow

        self.location = str((out / "mlruns").resolve())
        mlflow.set_tracking_uri(Path(self.location).as_uri())
        mlflow.set_experiment("tunebench")
        mlflow.start_run(run_name=run_name)
        self.mlflow = mlflow
        try:
            mlflow.log_params({k: str(v)[:250] for k, v in params.items()})
        except Exception:
            mlflow.end_run("FAILED")  # not left the process's active run
            raise

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class _Wandb:
    """A run of its own (not a user's active one) in output_dir/wandb/; offline (WANDB_MODE=offline) it needs
    no network and `wandb sync` uploads it later."""

    def __init__(self, out: Path, run_name: str, params: dict[str, Any]):
        import wandb

        # system metrics and console capture off: tunebench's record has its own telemetry and log lines (a
        # user's WANDB_X_DISABLE_STATS=false turns the metrics back on); quiet: the line below says where it is
        stats_off = os.environ.get("WANDB_X_DISABLE_STATS", "true").lower() not in ("false", "0")
        settings = wandb.Settings(console="off", x_disable_stats=stats_off, quiet=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "tunebench", name=run_name,
                              dir=str(out.resolve()), config=json.loads(json.dumps(params, default=str)),
                              reinit="create_new", settings=settings)
        try:
            # the metrics' x axis is the job's step, logged beside them: wandb's own step must only grow, and a
            # loss read back LAG steps late comes after the step's learning rate
            self.run.define_metric("step", hidden=True)
            self.run.define_metric("*", step_metric="step")
            self.location = _where(self.run)
        except Exception:
            self.run.finish(exit_code=1)
            raise

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "step": step})

    def close(self) -> None:
        self.run.finish()


def _where(run: Any) -> str | None:
    """The run's URL, or its offline folder (said with the command that uploads it); None when WANDB_MODE=disabled
    (nothing is kept)."""
    mode = run.settings.mode
    if mode == "disabled":
        return None
    if mode in ("offline", "dryrun"):
        folder = str(Path(run.settings.sync_dir))
        say(f"track: wandb run offline in {folder} (upload it with: wandb sync {folder})")
        return folder
    say(f"track: wandb run {run.url}")
    return str(run.url)


START: dict[str, Callable[[Path, str, dict[str, Any]], Any]] = {
    "tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _Wandb}


def _dropped(name: str, when: str, err: Exception) -> None:
    """One line: the reason's first (a library's message can run on with hints)."""
    reason = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    say(f"tunebench: warning: tracker {name} failed {when} and is dropped, the job goes on: "
        f"{type(err).__name__}{': ' + reason if reason else ''}")


class Trackers:
    """Rank 0 only; a tracker that fails (starting, logging or closing) is dropped with one warning line, the
    job goes on."""

    def __init__(self, names: list[str], out: Path, run_name: str, params: dict[str, Any]):
        self.live: dict[str, Any] = {}
        self._locations: dict[str, str] = {}
        for name in names:
            try:
                self.live[name] = START[name](out, run_name, params)
            except Exception as err:
                _dropped(name, "to start", err)
                continue
            if self.live[name].location:
                self._locations[name] = self.live[name].location

    def locations(self) -> dict[str, str]:
        """Where each tracker that started keeps its run (a URL or a folder), for the job's record; one dropped
        mid-run is kept: its run holds the steps before."""
        return dict(self._locations)

    def log(self, values: dict[str, float], step: int) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        for name, tracker in list(self.live.items()):
            try:
                tracker.log(values, step)
            except Exception as err:
                del self.live[name]
                _dropped(name, f"at step {step}", err)
                _close_quietly(tracker)

    def close(self) -> None:
        for name, tracker in list(self.live.items()):
            try:
                tracker.close()
            except Exception as err:
                _dropped(name, "to close", err)
        self.live.clear()


def _close_quietly(tracker: Any) -> None:
    """What a failed tracker already has is kept if it can be; its warning has been said."""
    try:
        tracker.close()
    except Exception:
        pass
