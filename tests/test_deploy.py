"""Deployment: manifests valid offline, user arguments literal everywhere, the generated command
really runs as two nodes, logs collected into a store, the Slurm script, the Dockerfile."""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import free_port
from tunebench.deploy.k8s import K8sJob, manifests
from tunebench.deploy.slurm import sbatch_script, srun_argv
from tunebench.deploy.validate import validate
from tunebench.store import Store

ROOT = Path(__file__).resolve().parents[1]
NASTY = ["--tag", "two words", "--tag", "$(touch /tmp/tunebench-pwned)", "--tag", "`touch /tmp/tunebench-pwned`",
         "--tag", "quotes ' and \" and \\", "--tag", "line one\nline two", "--tag", "$HOME ${PATH} $$ ;|&"]
TINY = ["run", "--model", "tiny-llama", "--device", "cpu", "--steps", "4", "--warmup", "1", "--seq-len", "32",
        "--strategy", "ddp"]


def kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command/args: $$ -> $, $(VAR) -> its value when VAR is defined."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, arg)


def _container(doc: dict) -> dict:
    if doc["kind"] == "JobSet":
        return doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    if doc["kind"] == "Job":
        return doc["spec"]["template"]["spec"]["containers"][0]
    return doc["spec"]["trainer"]


@pytest.mark.parametrize("kind", ["jobset", "indexed-job", "trainjob"])
@pytest.mark.parametrize("nodes,fabric,host_network", [(2, "ethernet", False), (4, "infiniband", True), (1, "ethernet", False)])
def test_manifests_validate_offline(tb, tmp_path, kind, nodes, fabric, host_network):
    out = tmp_path / "m.yaml"
    argv = ["deploy", "k8s", "--name", "bench", "--nodes", str(nodes), "--gpus-per-node", "8", "--image",
            "registry.example/tunebench:1", "--kind", kind, "--namespace", "ml", "--pvc", "results", "--fabric",
            fabric, "--node-selector", "nvidia.com/gpu.product=H100", "--toleration", "nvidia.com/gpu:NoSchedule",
            "--image-pull-secret", "regcred", "-o", str(out)] + (["--host-network"] if host_network else [])
    code, _, err = tb(*argv, "--", *TINY, *NASTY)
    if kind == "trainjob" and host_network:
        assert code == 2 and "cannot set hostNetwork" in err
        return
    assert code == 0, err
    docs = list(yaml.safe_load_all(out.read_text()))
    assert {d["kind"] for d in docs} == {"jobset": {"JobSet"}, "indexed-job": {"Job", "Service"},
                                        "trainjob": {"TrainJob"}}[kind]
    for d in docs:
        validate(d)  # raises on any schema violation
    text = out.read_text()
    assert "regcred" in text and "password" not in text.lower() and "dockerconfigjson" not in text
    assert ("hostNetwork: true" in text) == host_network
    c = _container(next(d for d in docs if d["kind"] != "Service"))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NCCL_IB_DISABLE"] == ("1" if fabric == "ethernet" else "0")
    if kind != "trainjob":
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8 and c["volumeMounts"][0]["mountPath"] == "/dev/shm"


def test_validation_is_strict():
    job = K8sJob("bench", 2, 1, "img", TINY)
    for build in ("jobset", "indexed-job", "trainjob"):
        job.kind = build
        doc = copy.deepcopy([d for d in manifests(job) if d["kind"] != "Service"][0])
        bad = copy.deepcopy(doc)
        bad["spec"]["nosuchfield"] = 1
        with pytest.raises(Exception):
            validate(bad)
        validate(doc)


@pytest.mark.parametrize("kind,rank_var,endpoint", [
    ("jobset", "NODE_RANK", "bench-node-0-0.bench:29400"),
    ("indexed-job", "NODE_RANK", "bench-0.bench:29400"),
    ("trainjob", "PET_NODE_RANK", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"),
])
def test_user_arguments_stay_literal_in_manifests(kind, rank_var, endpoint):
    job = K8sJob("bench", 2, 4, "img", ["run", "--model", "tiny-llama", *NASTY], kind=kind)
    doc = [d for d in manifests(job) if d["kind"] != "Service"][0]
    cmd = _container(doc)["command"]
    env = {rank_var: "1", "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "1", "HOME": "/should/not/expand"}
    expanded = [kubelet_expand(a, env) for a in cmd]
    assert expanded[1:2 + len(NASTY) + 2] == ["run", "--model", "tiny-llama", *NASTY]
    i = expanded.index("--node-rank")
    assert expanded[i + 1] == "1"
    assert expanded[expanded.index("--rdzv-endpoint") + 1] == kubelet_expand(endpoint, env)


def test_generated_command_runs_as_two_nodes_and_logs_are_collected(tb, tmp_path):
    job = K8sJob("bench", 2, 1, "img", [*TINY, *NASTY], kind="indexed-job")
    cmd = _container(manifests(job)[1])["command"]
    port = free_port()
    procs = []
    for rank in (0, 1):
        argv = [kubelet_expand(a, {"NODE_RANK": str(rank)}) for a in cmd]
        argv = [a.replace("bench-0.bench:29400", f"127.0.0.1:{port}") for a in argv]
        assert argv[0] == "tunebench"
        env = os.environ | {"TUNEBENCH_STORE": str(tmp_path / f"node{rank}.db")}  # each pod's own disk
        procs.append(subprocess.Popen([sys.executable, "-m", "tunebench.cli", *argv[1:]], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    logs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][1][-2000:] + logs[1][1][-2000:]
    for rank, (out, _) in enumerate(logs):
        (tmp_path / f"pod-{rank}.log").write_text(out)
    assert not Path("/tmp/tunebench-pwned").exists()
    store = tmp_path / "collected.db"
    code, out, _ = tb("collect", str(tmp_path / "pod-0.log"), str(tmp_path / "pod-1.log"), "--store", str(store))
    assert code == 0 and "1 records found, 1 new" in out
    rec = list(Store(store).records())[0]
    assert rec.status == "ok" and rec.metrics.world_size == 2 and rec.metrics.nnodes == 2
    assert rec.tags == NASTY[1::2]  # every nasty argument arrived literally
    code, out, _ = tb("collect", str(tmp_path / "pod-0.log"), str(tmp_path / "pod-1.log"), "--store", str(store))
    assert "0 new, 1 already" in out  # duplicates skipped
    # the same record also sits in the store of the node that held rank 0: merging skips it too
    merged = tmp_path / "merged.db"
    code, out, _ = tb("results", "merge", *(str(p) for p in tmp_path.glob("node*.db")), str(store),
                      "--store", str(merged))
    assert code == 0 and Store(merged).count() == 1


def test_collect_from_stdin_skips_broken_blocks(tmp_path):
    good = subprocess.run([sys.executable, "-m", "tunebench.cli", *TINY[:1], "--model", "tiny-llama", "--device",
                           "cpu", "--steps", "2", "--warmup", "1", "--seq-len", "16", "--print-result", "--no-store"],
                          capture_output=True, text=True, timeout=300).stdout
    log = "noise\n---TUNEBENCH-RESULT-BEGIN---\n{\"cut\": \n" + good + "more noise\n"
    p = subprocess.run([sys.executable, "-m", "tunebench.cli", "collect", "-", "--store", str(tmp_path / "r.db")],
                       input=log, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "1 records found, 1 new" in p.stdout


def test_slurm_script(tmp_path):
    user = ["run", "--model", "mistral-7b", "--method", "qlora", *NASTY]
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(user, nodes=2, gpus_per_node=8))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "#SBATCH --nodes=2" in script.read_text() and "#SBATCH --gpus-per-node=8" in script.read_text()
    # Run the script with stand-ins for scontrol and srun: srun prints the argv it was given.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "scontrol").write_text("#!/bin/sh\necho gpu-node-0\necho gpu-node-1\n")
    (shim / "srun").write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} -c "
                               "'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    for f in shim.iterdir():
        f.chmod(0o755)
    env = os.environ | {"PATH": f"{shim}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-node-[0-1]",
                        "SLURM_NODEID": "1", "SLURM_JOB_ID": "4242"}
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ran = json.loads(p.stdout)
    expected = [a.replace("$SLURM_NODEID", "1").replace("${head}", "gpu-node-0").replace("$SLURM_JOB_ID", "4242")
                for a in srun_argv(user, 2, 8, None)]
    assert ran == expected
    assert ran[1:3 + len(NASTY)] == ["run", "--model", "mistral-7b", "--method", "qlora", *NASTY][:2 + len(NASTY)]
    # and it is the command the Kubernetes manifests run, up to the platform's variables
    k8s = _container(manifests(K8sJob("bench", 2, 8, "img", user, kind="indexed-job"))[1])["command"]
    k8s = [kubelet_expand(a, {"NODE_RANK": "1"}) for a in k8s]
    k8s[k8s.index("--rdzv-endpoint") + 1] = "gpu-node-0:29400"  # the platforms name the first node differently
    k8s[k8s.index("--rdzv-id") + 1] = "4242"
    assert k8s == ran


def test_bad_deploy_input(tb):
    for argv, needle in ((["deploy", "k8s", "--name", "Bad_Name", "--image", "i", "--", "run"], "invalid name"),
                         (["deploy", "k8s", "--name", "b", "--image", "i", "--", "hw"], "starting with run"),
                         (["deploy", "k8s", "--name", "b", "--image", "i", "--nodes", "2", "--", "sweep", "x"],
                          "sweeps run on one node"),
                         (["deploy", "slurm", "--", "run", "--nnodes", "3"], "--nnodes is set by the deployment"),
                         (["deploy", "k8s", "--name", "b", "--image", "i", "--toleration", "x", "--", "run"],
                          "toleration")):
        code, _, err = tb(*argv)
        assert code == 2 and needle in err, err


def test_dockerfile_parses_and_uses_the_constraints():
    from dockerfile_parse import DockerfileParser

    df = DockerfileParser(path=str(ROOT / "Dockerfile"))
    instr = [(i["instruction"], i["value"]) for i in df.structure]
    froms = [v for k, v in instr if k == "FROM"]
    assert len(froms) == 2 and all("CUDA_IMAGE" in v for v in froms)  # multi-stage on the CUDA runtime
    base = next(v for k, v in instr if k == "ARG" and v.startswith("CUDA_IMAGE=")).split("=", 1)[1]
    assert base.startswith("nvidia/cuda:") and "runtime" in base
    runs = " ".join(v for k, v in instr if k == "RUN")
    assert runs.count("-c constraints.txt") == 3 and "COPY" in [k for k, _ in instr]
    assert any(k == "COPY" and "constraints.txt" in v for k, v in instr)
    users = [v for k, v in instr if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert "HF_HUB_OFFLINE=1" in " ".join(v for k, v in instr if k == "ENV")
    assert any(k == "ARG" and v.startswith("MODEL_DIR") for k, v in instr)
    default_model = next(v for k, v in instr if k == "ARG" and v.startswith("MODEL_DIR=")).split("=", 1)[1]
    assert (ROOT / default_model).is_dir()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    # the constraints file pins every package the image installs with it
    pins = {ln.split("==")[0].lower() for ln in (ROOT / "constraints.txt").read_text().splitlines() if "==" in ln}
    assert {"torch", "deepspeed", "transformers", "peft", "bitsandbytes", "pydantic"} <= pins
