"""Metrics to TensorBoard and/or MLflow (a local file store in output_dir), through their own libraries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tunebench.errors import require


def check(trackers: list[str]) -> None:
    for t in trackers:
        require("tensorboard" if t == "tensorboard" else "mlflow", f"track={t}",
                "pip install tensorboard" if t == "tensorboard" else "pip install mlflow-skinny")


class Trackers:
    """Rank 0 only; a tracker that fails mid-run is dropped with a note, the job goes on."""

    def __init__(self, names: list[str], out: Path, run_name: str, params: dict[str, Any]):
        self.tb = self.mlflow = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out / "tensorboard"))
        if "mlflow" in names:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the local file store, no server
            import mlflow

            mlflow.set_tracking_uri((out / "mlruns").resolve().as_uri())
            mlflow.set_experiment("tunebench")
            mlflow.start_run(run_name=run_name)
            mlflow.log_params({k: str(v)[:250] for k, v in params.items()})
            self.mlflow = mlflow

    def log(self, values: dict[str, float], step: int) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        if self.tb:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.mlflow:
            self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.mlflow:
            self.mlflow.end_run()
