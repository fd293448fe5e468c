"""`tunebench train --track wandb` on the CPU, offline: the run's config, metrics and eval curve read back from its
own file, no system metrics, its folder in the record; a tracker that fails to start or mid-run only warns."""

import json
import struct
from pathlib import Path

import psutil
import pytest

from conftest import counting_model

wandb = pytest.importorskip("wandb")

@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local model folder (Llama shape, random weights) with a BPE tokenizer trained on the data."""
    root = tmp_path_factory.mktemp("track")
    counting_model(root, 200)
    return root


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """wandb never reaches the network, and its service process is gone after each test."""
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    for k in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_DIR", "WANDB_X_DISABLE_STATS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no user's ~/.config/wandb
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # online by mistake: refused at once, locally
    yield
    wandb.teardown()
    assert not [p for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]


def _args(local, out: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--seq-len", "64",
            "--batch-size", "4", "--lr", "3e-3", "--device", "cpu", "--precision", "fp32", "--max-steps", "4",
            "--log-every", "1", "--output-dir", str(out), "--no-store", "--json", *extra]


def _records(path: Path):
    """The protobuf records of a run's .wandb file: a leveldb-style log (a 7-byte file header, then 32 KiB blocks
    of chunks, each a 7-byte header: CRC32C, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, parts = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(parts)
            parts = b""
            yield rec
        elif kind == 0:
            break


def _read_run(folder: Path) -> tuple[dict, list[dict], list]:
    """The run's name, project and config, its history rows and its system-metric records."""
    [path] = folder.glob("run-*.wandb")
    config, rows, stats = {}, [], []
    for rec in _records(path):
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):  # the config given to wandb.init comes in the run's own record
            update = rec.run.config.update if kind == "run" else rec.config.update
            config.update({i.key: json.loads(i.value_json) for i in update})
            if kind == "run":
                config["_run"] = {"name": rec.run.display_name, "project": rec.run.project}
        elif kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "stats":
            stats.append(rec)
    return config, rows, stats


def test_offline_run_holds_the_config_metrics_and_eval_curve(tb, local, tmp_path):
    out = tmp_path / "out"
    code, stdout, err = tb(*_args(local, out, "--track", "wandb", "--eval-fraction", "0.1", "--eval-every", "2"))
    assert code == 0, err
    rec = json.loads(stdout)
    [folder] = (out / "wandb").glob("offline-run-*")
    assert rec["metrics"]["job"]["trackers"] == {"wandb": str(folder.resolve())}
    assert f"wandb sync {folder.resolve()}" in err and "warning" not in err
    config, rows, stats = _read_run(folder)
    assert config["output_dir"] == str(out) and config["max_steps"] == 4 and config["track"] == ["wandb"]
    assert config["_run"] == {"name": "out", "project": "tunebench"}
    losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert losses == pytest.approx(dict(enumerate(rec["metrics"]["losses"], start=1)))
    assert {r["step"] for r in rows if "train/lr" in r} == {1, 2, 3, 4}
    evals = [[r["step"], r["eval/loss"]] for r in rows if "eval/loss" in r]
    curve = rec["metrics"]["job"]["eval_curve"]
    assert [s for s, _ in evals] == [s for s, _ in curve] == [0, 2, 4]
    assert [v for _, v in evals] == pytest.approx([v for _, v in curve])
    assert all("eval/perplexity" in r for r in rows if "eval/loss" in r)
    assert not stats and not [k for r in rows for k in r if k.startswith("system/")]


def test_a_tracker_that_cannot_start_only_warns(tb, local, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # no API key: wandb refuses to start
    out = tmp_path / "out"
    code, stdout, err = tb(*_args(local, out, "--track", "wandb,tensorboard"))
    assert code == 0, err
    [warning] = [line for line in err.splitlines() if "warning" in line]
    assert "tracker wandb failed to start" in warning
    job = json.loads(stdout)["metrics"]["job"]
    assert job["exit"] == "completed" and job["trackers"] == {"tensorboard": str((out / "tensorboard").resolve())}
    assert (out / "record.json").is_file() and job["outputs"] and all(Path(p).is_dir() for p in job["outputs"].values())


def test_a_tracker_that_fails_mid_run_is_dropped(tb, local, tmp_path, monkeypatch):
    from wandb.sdk.wandb_run import Run

    logged = []

    def log(self, values, *a, **kw):
        logged.append(values)
        if len(logged) == 3:
            raise RuntimeError("the tracker broke")

    monkeypatch.setattr(Run, "log", log)
    out = tmp_path / "out"
    code, stdout, err = tb(*_args(local, out, "--track", "wandb,tensorboard"))
    assert code == 0, err
    [warning] = [line for line in err.splitlines() if "warning" in line]
    assert "tracker wandb failed at step 2" in warning and "RuntimeError: the tracker broke" in warning
    assert len(logged) == 3  # never called again
    job = json.loads(stdout)["metrics"]["job"]
    assert job["exit"] == "completed" and job["steps"] == 4 and set(job["trackers"]) == {"wandb", "tensorboard"}
    assert (out / "record.json").is_file() and list((out / "tensorboard").glob("events.*"))


def test_tensorboard_and_mlflow_failing_are_dropped_too(tmp_path, monkeypatch, capsys):
    """The same for the other trackers, without training: mlflow cannot start, tensorboard fails mid-run."""
    import mlflow
    from torch.utils.tensorboard import SummaryWriter

    from tunebench.trainer.tracking import Trackers

    def broken(*a, **kw):
        raise OSError("disk full\nmore detail")

    monkeypatch.setattr(mlflow, "start_run", broken)
    monkeypatch.setattr(SummaryWriter, "add_scalar", broken)
    trackers = Trackers(["mlflow", "tensorboard"], tmp_path, "run", {"lr": 0.1})
    trackers.log({"train/loss": 1.0}, 1)
    trackers.log({"train/loss": 0.5}, 2)
    trackers.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert [line.split(" and is dropped")[0] for line in lines] == [
        "tunebench: warning: tracker mlflow failed to start", "tunebench: warning: tracker tensorboard failed at step 1"]
    assert all(line.endswith("OSError: disk full") for line in lines)
    assert trackers.locations() == {"tensorboard": str((tmp_path / "tensorboard").resolve())}
