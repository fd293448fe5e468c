"""A sweep spread over a cluster: the exact task commands of the Indexed Jobs and of the Slurm array, run here
for each index, assemble one sweep in the local store; a resumed deployment lists only what is missing."""

import json
import os
import subprocess
import sys

import yaml

from tunebench.deploy.validate import validate
from tunebench.store import Store

SUITE = {"name": "cl", "base": {"model": "tiny-llama", "device": "cpu", "seq_len": 32, "steps": 3, "warmup": 1},
         "runs": [{"name": "full"}, {"name": "lora", "method": "lora"},
                  {"name": "ddp", "method": "lora", "strategy": "ddp", "nproc_per_node": 2}]}


def _task(cmd: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    assert cmd[:2] == ["tunebench", "sweep"]
    return subprocess.run([sys.executable, "-m", "tunebench.cli", *cmd[1:]], env=os.environ | env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_indexed_jobs_run_one_configuration_each_and_resume(tb, tmp_path):
    suite, local = tmp_path / "s.yaml", tmp_path / "local.db"
    suite.write_text(yaml.safe_dump(SUITE))
    out = tmp_path / "sweep.yaml"
    code, _, err = tb("deploy", "k8s", "--name", "cl", "--image", "r/tb:1", "--pvc", "vol", "--sweep", str(suite),
                      "--parallelism", "2", "--sweep-store", str(local), "-o", str(out))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out.read_text()))
    for d in docs:
        validate(d)
    definition = json.loads(docs[0]["data"]["definition.json"])
    sweep_id = definition["sweep_id"]
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    assert set(jobs) == {"cl-g1", "cl-g2"}  # each pod asks for the GPUs its configuration needs
    assert jobs["cl-g1"]["spec"]["completions"] == 2 and jobs["cl-g2"]["spec"]["completions"] == 1
    pod = jobs["cl-g2"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "definition.json").write_text(docs[0]["data"]["definition.json"])
    logs = []
    for name, index in (("cl-g1", 0), ("cl-g2", 0)):  # the third task (cl-g1, index 1) is still to come
        cmd = [a.replace("/sweep/", f"{tmp_path}/sweep/").replace("/results/", f"{tmp_path}/vol/")
               for a in jobs[name]["spec"]["template"]["spec"]["containers"][0]["command"]]
        p = _task(cmd, {"JOB_COMPLETION_INDEX": str(index)}, tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        logs.append(tmp_path / f"{name}-{index}.log")
        logs[-1].write_text(p.stdout)
    assert len(list((tmp_path / "vol" / sweep_id).glob("*.db"))) == 2  # one store file per pod on the volume
    code, text, _ = tb("collect", *map(str, logs), "--store", str(local))
    assert code == 0 and "2 records found, 2 new" in text
    code, _, err = tb("deploy", "k8s", "--name", "cl", "--image", "r/tb:1", "--resume", sweep_id, "--sweep-store",
                      str(local), "-o", str(out))
    assert code == 0, err
    left = json.loads(next(yaml.safe_load_all(out.read_text()))["data"]["definition.json"])
    assert [definition["entries"][e]["name"] for e, _ in left["tasks"]] == ["lora"]  # only what has no ok result
    cmd = [a.replace("/sweep/", f"{tmp_path}/sweep/") for a in
           [d for d in yaml.safe_load_all(out.read_text()) if d["kind"] == "Job"][0]["spec"]["template"]["spec"][
               "containers"][0]["command"]]
    (tmp_path / "sweep" / "definition.json").write_text(json.dumps(left))
    p = _task(cmd, {"JOB_COMPLETION_INDEX": "0"}, tmp_path)
    (tmp_path / "last.log").write_text(p.stdout)
    assert tb("collect", str(tmp_path / "last.log"), "--store", str(local))[0] == 0
    with Store(local) as s:
        recs = [r for r in s.records() if r.sweep_id == sweep_id]
    assert sorted(r.config["method"] + "/" + r.config["strategy"] for r in recs) == ["full/single", "lora/ddp",
                                                                                      "lora/single"]
    assert all(r.status == "ok" for r in recs)
    code, _, err = tb("sweep", "--resume", sweep_id, "--store", str(local))
    assert code == 0 and "0 runs to do" in err
    code, _, err = tb("deploy", "k8s", "--name", "cl", "--image", "r/tb:1", "--resume", sweep_id, "--sweep-store",
                      str(local))
    assert code == 2 and "nothing to deploy" in err


def test_slurm_array_tasks(tb, tmp_path):
    suite, local = tmp_path / "s.yaml", tmp_path / "local.db"
    suite.write_text(yaml.safe_dump(SUITE | {"runs": SUITE["runs"][:2]}))
    script = tmp_path / "sweep.sbatch"
    code, _, err = tb("deploy", "slurm", "--sweep", str(suite), "--parallelism", "3", "--sweep-store", str(local),
                      "--store", str(tmp_path / "shared" / "task-{index}.db"), "-o", str(script))
    assert code == 0, err
    text = script.read_text()
    assert "#SBATCH --array=0-1%3" in text and subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "srun").write_text(f"#!/bin/sh\nshift\nshift\nexec {sys.executable} -m tunebench.cli \"$@\"\n")
    (shim / "srun").chmod(0o755)
    logs = []
    for i in (0, 1):
        p = subprocess.run(["bash", str(script)], env=os.environ | {"PATH": f"{shim}:{os.environ['PATH']}",
                                                                    "SLURM_ARRAY_TASK_ID": str(i)},
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        logs.append(tmp_path / f"task-{i}.out")
        logs[-1].write_text(p.stdout)
    assert sorted(p.name for p in (tmp_path / "shared").glob("*.db")) == ["task-0.db", "task-1.db"]
    merged = tmp_path / "merged.db"
    code, _, _ = tb("results", "merge", *(str(p) for p in (tmp_path / "shared").glob("*.db")), "--store", str(merged))
    assert code == 0
    with Store(merged) as s:
        recs = list(s.records())
        assert len(recs) == 2 and len({r.sweep_id for r in recs}) == 1
        assert s.sweep(recs[0].sweep_id)["name"] == "cl"  # the definition came along: the sweep can be resumed
