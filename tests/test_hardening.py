"""Nothing lost, nothing injected, no traceback: each class of hostile or careless input, on the CPU."""

import json
import sqlite3
import subprocess
import sys

import pytest
import yaml

from conftest import QUICK, run_json
from tunebench.deploy.validate import validate
from tunebench.record import ResultRecord, TrainMetrics
from tunebench.store import Store


def _one_line(code: int, err: str, needle: str, expect: int = 2) -> None:
    assert code == expect, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunebench: error: ") and needle in lines[0], err
    assert "Traceback" not in err


# --- injection into manifests and scripts ---------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (["slurm", "--job-name", "x\nrm -rf ~"], "job-name"),
    (["slurm", "--partition", "gpu\n#SBATCH --exclusive"], "partition"),
    (["slurm", "--time", "1:00:00\ncurl evil"], "time"),
    (["slurm", "--time", "an hour"], "time"),
    (["slurm", "--store", "/r.db\nrm -rf /"], "store"),
    (["k8s", "--name", "b", "--image", "img:1\necho pwned"], "image"),
    (["k8s", "--name", "b", "--image", "UPPER/Case/Path"], "image"),
    (["k8s", "--name", "b", "--image", "i", "--namespace", "Bad;NS"], "namespace"),
    (["k8s", "--name", "b", "--image", "i", "--shm-size", "lots"], "shm-size"),
    (["k8s", "--name", "b", "--image", "i", "--pvc", "Results_PVC"], "pvc"),
    (["k8s", "--name", "b", "--image", "i", "--node-selector", "gpu type=a10"], "node-selector"),
    (["k8s", "--name", "b", "--image", "i", "--image-pull-secret", "my secret"], "image-pull-secret"),
])
def test_deploy_values_are_checked_for_their_field(tb, tmp_path, flags, needle):
    out = tmp_path / "out.yaml"
    code, stdout, err = tb("deploy", *flags, "-o", str(out), "--", "run")
    _one_line(code, err, needle)
    assert not out.exists() and stdout == ""


def test_deploy_checks_the_run_as_run_would(tb, tmp_path):
    out = tmp_path / "q.yaml"
    code, _, err = tb("deploy", "k8s", "--name", "q", "--nodes", "4", "--gpus-per-node", "8", "--image", "r/tb:1",
                      "-o", str(out), "--", "run", "--model", "mistral-7b", "--method", "qlora")
    _one_line(code, err, "strategy=single with 32 processes")
    for bad, needle in ((["--strategy", "zero3", "--optimizer", "adamw_8bit"], "optimizer=adamw_8bit"),
                        (["--seq-len", "99999"], "seq_len"),
                        (["--batch-size", "0"], "batch_size"), (["--bogus"], "--bogus")):
        code, _, err = tb("deploy", "slurm", "-o", str(out), "--", "run", "--model", "mistral-7b", "--method",
                          "qlora", *bad)
        _one_line(code, err, needle)
    assert not out.exists()
    code, _, err = tb("deploy", "k8s", "--name", "q", "--nodes", "4", "--gpus-per-node", "8", "--image",
                      "REGISTRY/tunebench:0.1", "-o", str(out), "--", "run", "--model", "mistral-7b", "--method",
                      "qlora", "--strategy", "ddp")
    assert code == 0, err
    for doc in yaml.safe_load_all(out.read_text()):
        validate(doc)


# --- nothing lost -------------------------------------------------------------------------------------------

def test_export_never_truncates_what_it_cannot_replace(tb, tmp_path):
    keep = tmp_path / "precious.csv"
    keep.write_text("the user's data\n")
    bad = tmp_path / "bad.db"
    bad.write_text("not a database at all" * 100)
    code, _, err = tb("results", "export", "-o", str(keep), "--store", str(bad))
    _one_line(code, err, "not a tunebench results database")
    assert keep.read_text() == "the user's data\n"
    store = tmp_path / "r.db"
    run_json(tb, store)
    _one_line(*tb("results", "export", "-o", str(tmp_path / "no" / "dir" / "x.csv"), "--store", str(store))[::2],
              "does not exist")
    _one_line(*tb("results", "export", "-o", str(tmp_path), "--store", str(store))[::2], "is a folder")
    assert tb("results", "export", "-o", str(keep), "--store", str(store))[0] == 0
    assert keep.read_text().startswith("id,")
    assert not list(tmp_path.glob(".*.tmp-*"))  # nothing left beside it


def test_markers_are_unforgeable_and_broken_blocks_counted(tb, tmp_path):
    nasty = ["---TUNEBENCH-RESULT-END---", "---TUNEBENCH-RESULT-BEGIN---", "a\n---TUNEBENCH-RESULT-END---\nb"]
    args = [*QUICK, "--print-result", "--no-store"] + [f"--tag={t}" for t in nasty]
    code, out, _ = tb("run", *args)
    assert code == 0
    block = out[out.index("---TUNEBENCH-RESULT-BEGIN--- sha256="):]
    altered = block.replace('"status":"ok"', '"status":"oom"')
    log = tmp_path / "pod.log"
    log.write_text("noise ---TUNEBENCH-RESULT-BEGIN--- in a line\n" + block + "\n---TUNEBENCH-RESULT-BEGIN---\n{cut"
                   "\n" + altered + "\n")
    code, out, err = tb("collect", str(log), "--store", str(tmp_path / "r.db"))
    assert code == 0 and "1 records found, 1 new" in out and "2 block(s) skipped" in out, out + err
    assert "no end marker" in err and "checksum" in err
    (rec,) = Store(tmp_path / "r.db").records()
    assert rec.tags == nasty and rec.status == "ok"


def test_store_is_checked_before_any_work(tb, tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_text("garbage " * 200)
    _one_line(*tb("run", *QUICK, "--store", str(bad))[::2], "not a tunebench results database")
    _one_line(*tb("run", *QUICK, "--store", str(tmp_path))[::2], "is a directory")
    _one_line(*tb("run", *QUICK, "--store", ":memory:")[::2], "in-memory")
    truncated = tmp_path / "t.db"
    run_json(tb, truncated)
    truncated.write_bytes(truncated.read_bytes()[:1000])
    code, _, err = tb("run", *QUICK, "--store", str(truncated))
    assert code == 2 and "Traceback" not in err


def test_report_never_overwrites_a_users_folder(tb, tmp_path):
    store = tmp_path / "r.db"
    run_json(tb, store)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    _one_line(*tb("report", "--store", str(store), "--out", str(mine))[::2], "not a tunebench report")
    assert (mine / "report.md").read_text() == "my notes"
    _one_line(*tb("report", "--store", str(store), "--out", "/")[::2], "root")
    _one_line(*tb("report", "--store", str(store), "--out", str(mine / "report.md"))[::2], "is a file")
    rep = tmp_path / "rep"
    code, _, err = tb("report", "--store", str(store), "--out", str(rep))
    assert code == 0
    listed = err.split(": ", 2)[-1].strip().split(", ")
    manifest = json.loads((rep / ".tunebench-report.json").read_text())["files"]
    assert sorted(listed) == sorted(manifest) and "report.md" in manifest
    assert tb("report", "--store", str(store), "--out", str(rep))[0] == 0  # its own report folder: fine
    (mine / "notes.txt").write_text("keep me")
    assert tb("report", "--store", str(store), "--out", str(mine), "--force")[0] == 0
    assert (mine / "notes.txt").read_text() == "keep me"


def test_unreadable_rows_are_skipped_and_counted(tb, tmp_path):
    store = tmp_path / "r.db"
    good = run_json(tb, store)
    newer = dict(good, id="f" * 32, schema_version=3)
    with sqlite3.connect(store) as c:
        c.execute("INSERT INTO results (id, created_at, kind, status, record) VALUES (?,?,?,?,?)",
                  (newer["id"], newer["created_at"], "train", "ok", json.dumps(newer)))
        c.execute("INSERT INTO results (id, created_at, kind, status, record) VALUES (?,?,?,?,?)",
                  ("e" * 32, newer["created_at"], "train", "ok", "{not json"))
    for argv in (["results", "list"], ["results", "export", "--format", "jsonl"], ["report", "--out",
                 str(tmp_path / "rep")], ["compare", str(store), str(store)]):
        code, out, err = tb(*argv, "--store", str(store))
        assert code == 0, err
        assert "2 result(s)" in err and "written by a newer tunebench" in err and "damaged" in err
    code, _, err = tb("results", "merge", str(store), "--store", str(tmp_path / "m.db"))
    assert code == 0 and Store(tmp_path / "m.db").count() == 1
    _one_line(*tb("results", "show", "fff", "--store", str(store))[::2], "newer tunebench")


# --- bad input that reached the model ------------------------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["--batch-size", "1" + "0" * 30], "batch_size"),
    (["--steps", "10000000000000"], "steps"),
    (["--lr", "inf"], "lr"),
    (["--lr", "nan"], "lr"),
    (["--timeout", "inf"], "timeout"),
    (["--method", "lora", "--lora-targets", ""], "lora_targets"),
    (["--method", "lora", "--lora-targets", "model"], "lora_targets"),
    (["--method", "lora", "--lora-targets", "layers"], "lora_targets"),
    (["--seq-len", "1000000", "--batch-size", "4096"], "tokens per step"),
    (["--store", ":memory:"], "in-memory"),
])
def test_values_that_used_to_reach_the_model(tb, tmp_path, argv, needle):
    _one_line(*tb("run", "--device", "cpu", "--steps", "3", "--warmup", "1", *argv)[::2], needle)


def test_config_files_and_sets(tb, tmp_path):
    empty = tmp_path / "e.yaml"
    empty.write_text("\n# nothing\n")
    _one_line(*tb("run", str(empty))[::2], "is empty")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"base": {"model": "tiny-llama"}, "runs": [{}]}))
    _one_line(*tb("sweep", str(suite), "--dry-run", "--set", "lr=[1, 2")[::2], "--set")
    suite.write_text(yaml.safe_dump({"base": {"model": "tiny-llama", "device": "cpu"},
                                     "axes": {"precision": ["fp32", "fp16"]}}))
    code, out, err = tb("sweep", str(suite), "--dry-run", "--store", str(tmp_path / "r.db"))
    _one_line(code, err, "1 of 2 configurations would be refused")
    assert "refused: invalid precision=fp16" in out and not (tmp_path / "r.db").exists()


def test_read_only_commands_neither_create_nor_crash(tb, tmp_path):
    missing = tmp_path / "typo.db"
    for argv in (["results", "list"], ["results", "show", "x"], ["report", "--out", str(tmp_path / "r")],
                 ["cost", "x"], ["compare", "a", "b"], ["consistency", "--sweep", "x"]):
        _one_line(*tb(*argv, "--store", str(missing))[::2], "no results store")
    assert not missing.exists()
    store = tmp_path / "r.db"
    rec = run_json(tb, store)
    _one_line(*tb("results", "show", "_", "--store", str(store))[::2], "no result with id '_'")
    assert tb("results", "show", rec["id"][:6], "--store", str(store))[0] == 0
    garbage = tmp_path / "g.jsonl"
    garbage.write_text(json.dumps(rec) + "\nthis is not json\n")
    code, _, err = tb("compare", str(garbage), str(store))
    _one_line(code, err, "line 2")  # exit 2, never the 1 that means a regression
    _one_line(*tb("results", "merge", str(tmp_path / "nope.db"), "--store", str(store))[::2], "does not exist")


def test_an_export_comes_back_in(tb, tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    run_json(tb, a)
    run_json(tb, a, "--method", "lora")
    exp = tmp_path / "x.jsonl"
    assert tb("results", "export", "--format", "jsonl", "-o", str(exp), "--store", str(a))[0] == 0
    code, out, _ = tb("collect", str(exp), "--store", str(b))
    assert code == 0 and "2 records found, 2 new" in out
    code, out, _ = tb("results", "merge", str(exp), "--store", str(tmp_path / "c.db"))
    assert code == 0 and "2 new" in out


def test_an_unexpected_error_is_one_line_with_its_own_exit_code(tmp_path):
    code = ("import tunebench.commands.results as r\n"
            "def boom(args): raise RuntimeError('disk on fire')\n"
            "r.cmd_results = boom\n"
            "from tunebench.cli import main\n"
            "raise SystemExit(main(['results', 'schema']))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 3 and "internal error: RuntimeError: disk on fire" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unsaved_result_is_printed_and_kept(tmp_path, monkeypatch, capsys):
    from tunebench.api import finalize

    rec = ResultRecord(config={"model": "m"}, config_hash="h", environment={"device": "cpu"}, status="ok",
                       metrics=TrainMetrics(tokens_per_s=1.0))
    blocked = tmp_path / "sub"
    blocked.write_text("a file where the store's folder should be")
    monkeypatch.chdir(tmp_path)
    finalize(rec, blocked / "r.db")
    assert rec.saved_to is None
    kept = tmp_path / f"tunebench-unsaved-{rec.id}.json"  # the store's folder is unusable: the current directory
    assert ResultRecord.model_validate_json(kept.read_text()).id == rec.id
    assert rec.id in capsys.readouterr().err
