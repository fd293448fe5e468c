"""`tunebench train` on the CPU: a tiny local model with a tokenizer trained here, learnable data made here.

Checks that it learns, that a resumed job equals an uninterrupted one, that a signal costs at most one step,
that packing keeps examples apart, that the outputs load in transformers, and each bad input's one line.
"""

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import cli_subprocess, counting_model
from tunebench.store import Store


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local model folder (Llama shape, random weights) with a BPE tokenizer trained on the data."""
    root = tmp_path_factory.mktemp("train")
    texts = counting_model(root)
    (root / "pairs.jsonl").write_text("".join(json.dumps({"prompt": " ".join(t.split()[:2]),
                                                          "completion": " " + " ".join(t.split()[2:])}) + "\n"
                                              for t in texts[:200]))
    (root / "chat.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": " ".join(t.split()[:2])},
        {"role": "assistant", "content": " ".join(t.split()[2:])}]}) + "\n" for t in texts[:200]))
    return root


def _args(local, *extra: str, batch: int = 4) -> list[str]:
    return ["train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--seq-len", "64",
            "--batch-size", str(batch), "--lr", "3e-3", "--device", "cpu", "--precision", "fp32", *extra]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))


def _json(tb, *argv) -> dict:
    code, out, err = tb(*argv, "--json")
    rec = json.loads(out)
    assert code == 0, err
    return rec


def test_it_learns_and_writes_everything(tb, local, tmp_path):
    store = tmp_path / "r.db"
    rec = _json(tb, *_args(local, "--max-steps", "30", "--eval-fraction", "0.1", "--eval-every", "10",
                           "--output-dir", str(tmp_path / "out"), "--store", str(store), "--track",
                           "tensorboard,mlflow"))
    job = rec["metrics"]["job"]
    curve = [loss for _, loss in job["eval_curve"]]
    assert [s for s, _ in job["eval_curve"]] == [0, 10, 20, 30]
    assert curve[0] == pytest.approx(math.log(320), abs=0.5)  # an untrained model: about ln(vocabulary)
    assert curve[-1] < curve[0] - 2.0  # eval loss falls well below its start
    assert job["eval_perplexity"] == pytest.approx(math.exp(curve[-1]))
    assert len(rec["metrics"]["losses"]) == 30 and job["steps"] == 30 and job["exit"] == "completed"
    assert job["data"]["shape"] == "text" and job["data"]["packing"] and job["data"]["examples"] > 300
    assert rec["metrics"]["tokens_per_s"] > 0 and rec["metrics"]["timed_steps"] == 25  # warmup 5 left out
    out = tmp_path / "out"
    assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert json.loads((out / "record.json").read_text())["id"] == rec["id"]
    assert [r.id for r in Store(store).records()] == [rec["id"]]
    assert list((out / "tensorboard").glob("events.*"))
    assert list((out / "mlruns").rglob("metrics/eval_loss"))
    code, _, err = tb("report", "--store", str(store), "--out", str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert code == 0 and "## Training jobs" in md and (tmp_path / "rep" / "loss_curves.png").is_file()


def test_packed_rows_keep_their_fullest_row_in_their_stats(tb, local, tmp_path):
    """The fullest packed row sizes every batch's examples' bounds: counted once when the rows are laid out, kept
    in the cache's stats; a cache written before them reads it from its positions, once."""
    from tunebench.data.prepare import Prepared, fullest_row_of

    _json(tb, *_args(local, "--max-steps", "6", "--output-dir", str(tmp_path / "a"), "--no-store"))
    [path] = (tmp_path / "cache").rglob("stats.json")
    stats = json.loads(path.read_text())
    positions = np.load(path.parent / "positions.npy")
    most = int(((positions == 0).sum(axis=1) + (positions[:, 0] != 0)).max())
    assert stats["fullest_row"] == most > 1
    del stats["fullest_row"]
    prepared = Prepared(path.parent, stats)
    assert fullest_row_of(prepared) == most and prepared.stats["fullest_row"] == most


def test_resumed_equals_uninterrupted(tb, local, tmp_path):
    whole = _json(tb, *_args(local, "--max-steps", "12", "--output-dir", str(tmp_path / "a"), "--no-store"))
    p = cli_subprocess(*_args(local, "--max-steps", "12", "--save-every", "6", "--fault", "abort@7",
                              "--output-dir", str(tmp_path / "b"), "--no-store"), timeout=300)
    assert p.returncode != 0 and (tmp_path / "b" / "checkpoints" / "step-000006" / "state.json").is_file()
    resumed = _json(tb, *_args(local, "--max-steps", "12", "--save-every", "6", "--resume", "latest",
                               "--output-dir", str(tmp_path / "b"), "--no-store"))
    assert resumed["metrics"]["job"]["resumed_from"].endswith("step-000006")
    assert resumed["metrics"]["losses"] == pytest.approx(whole["metrics"]["losses"], abs=1e-5)


def test_a_signal_costs_at_most_one_step(local, tmp_path):
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "tunebench.cli", *_args(local, "--max-steps", "100000",
                                                                        "--log-every", "1", "--output-dir", str(out),
                                                                        "--json", "--no-store")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    for line in p.stderr:
        if line.startswith("train: step "):
            seen = int(line.split()[2].split("/")[0])
            if seen >= 8:
                p.send_signal(signal.SIGTERM)
                break
    rest, _ = p.communicate(timeout=120)
    assert p.returncode == 75  # preempted, with its checkpoint saved
    rec = json.loads(rest)
    saved = json.loads(next((out / "checkpoints").glob("step-*/state.json")).read_text())["step"]
    # the step in flight when the signal lands finishes and is saved; the parent reads the log behind the
    # child (a busy CI machine was seen one step behind), so the step it saw may be one before that one
    assert rec["metrics"]["job"]["exit"] == "preempted" and seen <= saved <= seen + 2


def test_pairs_and_chat_train_on_the_answer(tb, local, tmp_path):
    for shape in ("pairs", "chat"):
        rec = _json(tb, *_args(local, "--data", str(local / f"{shape}.jsonl"), "--max-steps", "8", "--method",
                               "lora", "--output-dir", str(tmp_path / shape), "--no-store"))
        d = rec["metrics"]["job"]["data"]
        assert d["shape"] == shape and not d["packing"] and 0 < d["trained_tokens"] < d["tokens"] - d["examples"]
        everything = _json(tb, *_args(local, "--data", str(local / f"{shape}.jsonl"), "--max-steps", "8",
                                      "--method", "lora", "--train-on-prompt", "--output-dir",
                                      str(tmp_path / f"{shape}-all"), "--no-store"))["metrics"]["job"]["data"]
        # every token but each example's first is a label once the prompt trains too
        assert everything["trained_tokens"] == everything["tokens"] - everything["examples"]


def test_packing_keeps_examples_apart(local):
    """A packed row gives each example the logits it gets alone: no attention crosses examples."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(local / "model", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(local / "model")
    a, b = tok("one two three four")["input_ids"], tok("seven eight nine ten")["input_ids"]
    packed = torch.tensor([a + b])
    positions = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        together = model(input_ids=packed, position_ids=positions, use_cache=False).logits[0, len(a):]
        alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
        leaky = model(input_ids=packed, use_cache=False).logits[0, len(a):]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)
    assert (leaky - alone).abs().max() > 1e-3  # without the reset positions, b would see a


def test_merged_model_loads_and_equals_the_adapter(tb, local, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    rec = _json(tb, *_args(local, "--method", "lora", "--max-steps", "8", "--merge", "--output-dir", str(out),
                           "--no-store"))
    assert set(rec["metrics"]["job"]["outputs"]) == {"adapter", "merged"}
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(local / "model", dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, atol=2e-2, rtol=2e-2)  # merged in bf16
    code, _, err = tb("infer", "--model", str(out / "merged"), "--device", "cpu", "--precisions", "bf16",
                      "--batch-sizes", "1", "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--no-store")
    assert code == 0, err


def test_qlora_merge_dequantizes(tb, local, tmp_path):
    rec = _json(tb, *_args(local, "--method", "qlora", "--max-steps", "6", "--merge", "--output-dir",
                           str(tmp_path / "q"), "--no-store", "--precision", "bf16"))
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "q" / "merged")
    assert rec["status"] == "ok" and all(p.dtype == torch.bfloat16 for p in merged.parameters())


@pytest.fixture(scope="module")
def plain_curve(local, tmp_path_factory):
    """The losses of 30 steps with every matmul in fp32 (batch 2: the CPU's float8 matmul is a slow reference)."""
    out = tmp_path_factory.mktemp("f8") / "off"
    p = cli_subprocess(*_args(local, "--max-steps", "30", "--output-dir", str(out), "--no-store", "--json", batch=2),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["metrics"]["losses"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_follows_the_full_precision_curve(local, tmp_path, plain_curve, recipe):
    """float8 matmuls (torchao, on the CPU through torch's _scaled_mm) learn as the unconverted model does:
    over 30 steps, while the loss falls from 5.8 to 1.5, the two curves stay within 0.05 of each other (seen:
    0.01), and they are not the same curve (the layers did compute in float8)."""
    out = tmp_path / recipe
    p = cli_subprocess(*_args(local, "--max-steps", "30", "--output-dir", str(out), "--no-store", "--float8", recipe,
                              "--json", batch=2), timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    curve = json.loads(p.stdout)["metrics"]["losses"]
    assert len(curve) == len(plain_curve) == 30 and plain_curve[0] - plain_curve[-1] > 3
    gaps = [abs(a - b) for a, b in zip(curve, plain_curve)]
    assert 0 < max(gaps) < 0.05


def test_lora_float8_base_follows_the_unconverted_curve(local, tmp_path):
    """A LoRA run whose frozen base computes in float8 (models.float8_frozen) learns as the same run without:
    over 20 steps (the loss falling by more than 1) the curves stay within 0.05 of each other, and are not the
    same curve."""
    curves = []
    for float8 in ("off", "rowwise"):
        p = cli_subprocess(*_args(local, "--method", "lora", "--lr", "1e-2", "--max-steps", "20", "--output-dir",
                                  str(tmp_path / float8), "--no-store", "--float8", float8, "--json"), timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        curves.append(json.loads(p.stdout)["metrics"]["losses"])
    plain, f8 = curves
    assert len(plain) == len(f8) == 20 and plain[0] - plain[-1] > 1
    assert 0 < max(abs(a - b) for a, b in zip(plain, f8)) < 0.05


def test_float8_refusals(tb, local):
    from tunebench.models.float8 import refusal

    assert refusal((9, 0), "H100") is None and refusal((8, 9), "L4") is None
    assert "compute capability 8.9" in refusal((8, 0), "A100")
    for extra, needle in ((["--method", "lora", "--float8", "tensorwise"], "frozen base computes in float8 with rowwise"),
                          (["--float8", "rowwise", "--strategy", "zero2", "--nproc-per-node", "2"],
                           "not under DeepSpeed's zero2")):
        code, _, err = tb(*_args(local, "--no-store", *extra))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "invalid float8=" in err and needle in err


# zero3 (the base gathered from DeepSpeed's partitions) passes this test too, left out of the suite for its time
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_sharded_qlora_merge_is_the_quantized_base_plus_the_adapter(tb, local, tmp_path, strategy):
    """Under FSDP2 no rank holds the 4-bit base whole: merging gathers it. The merged model must be the local
    checkpoint quantized to NF4 and back, with the trained adapter applied."""
    import bitsandbytes.functional as bf
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "q"
    rec = _json(tb, *_args(local, "--method", "qlora", "--max-steps", "6", "--merge", "--output-dir", str(out),
                           "--no-store", "--strategy", strategy, "--nproc-per-node", "2"))
    assert rec["status"] == "ok", rec["error"]
    base = AutoModelForCausalLM.from_pretrained(local / "model", dtype=torch.float32)
    with torch.no_grad():
        for name, m in base.named_modules():
            if isinstance(m, torch.nn.Linear) and name != "lm_head":
                packed, state = bf.quantize_4bit(m.weight.data, blocksize=64, quant_type="nf4")
                m.weight.copy_(bf.dequantize_4bit(packed, state).to(torch.bfloat16))
        ids = torch.tensor([[1, 5, 9, 12, 7]])
        want = PeftModel.from_pretrained(base, out / "adapter").eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32).eval()
        got = merged(ids).logits
    assert (got - want).abs().max() < 1e-2 < want.abs().max()  # merged in bf16 (seen: 2.5e-3)


@pytest.mark.parametrize("extra,needle", [
    (["--data", "/no/such/data.jsonl"], "does not exist"),
    (["--data", "{empty}"], "the file is empty"),
    (["--text-field", ""], "invalid text_field="),
    (["--data", "{fields}"], "the data has: question, answer"),
    (["--data", "{roles}"], "unknown role 'wizard'"),
    (["--model", "tiny-llama"], "no tokenizer"),
    (["--tokenizer", "{bigtok}"], "more than the model's"),
    (["--resume", "latest"], "no complete checkpoint"),
    (["--output-dir", "{taken}"], "holds another training job"),
    (["--output-dir", "{foreign}"], "not a tunebench training job"),
    (["--track", "wandb,neptune"], "unknown tracker 'neptune'"),
])
def test_bad_input_is_one_line(tb, local, tmp_path, extra, needle):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "fields.jsonl").write_text(json.dumps({"question": "a", "answer": "b"}) + "\n")
    (tmp_path / "roles.jsonl").write_text(json.dumps({"messages": [{"role": "wizard", "content": "x"}]}) + "\n")
    (tmp_path / "taken" ).mkdir()
    (tmp_path / "taken" / "run.json").write_text("{}")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "thesis.tex").write_text("mine")
    big = tmp_path / "bigtok"
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(local / "model")
    t.add_tokens([f"tok{i}" for i in range(400)])
    t.save_pretrained(big)
    names = {"{empty}": "empty.jsonl", "{fields}": "fields.jsonl", "{roles}": "roles.jsonl", "{bigtok}": "bigtok",
             "{taken}": "taken", "{foreign}": "foreign"}
    extra = [str(tmp_path / names[x]) if x in names else x for x in extra]
    args = _args(local, "--max-steps", "8", "--output-dir", str(tmp_path / "new"), "--store", str(tmp_path / "r.db"))
    code, out, err = tb(*args, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "new").exists() and not (tmp_path / "r.db").exists()


def test_resume_refuses_another_job(tb, local, tmp_path):
    out = tmp_path / "out"
    _json(tb, *_args(local, "--max-steps", "6", "--output-dir", str(out), "--no-store"))
    code, _, err = tb(*_args(local, "--max-steps", "6", "--lr", "1e-4", "--output-dir", str(out), "--resume",
                             "latest", "--no-store"))
    assert code == 2 and "checkpoint is of another job: config" in err
    assert "fields changed: lr 0.003 there, 0.0001 here" in err  # what changed, not only the hashes


def test_prediction_from_a_stored_benchmark(tb, local, tmp_path):
    store = tmp_path / "r.db"
    bench = json.loads(tb("run", "--model", str(local / "model"), "--seq-len", "64", "--batch-size", "4", "--lr",
                          "3e-3", "--device", "cpu", "--precision", "fp32", "--steps", "8", "--warmup", "2",
                          "--store", str(store), "--json")[1])
    code, out, err = tb(*_args(local, "--max-steps", "10", "--output-dir", str(tmp_path / "o"), "--store",
                               str(store), "--json"))
    job = json.loads(out)["metrics"]["job"]
    assert code == 0 and job["predicted_from"] == f"stored run {bench['id'][:12]}" and "expected" in err
    assert job["predicted_s"] == pytest.approx(10 * 4 * 64 / bench["metrics"]["tokens_per_s"])


# DDP saves as one process does (tested above), ZeRO-2 through the DeepSpeed checkpoint that zero3 uses here: it
# passes this test too, and is left out of the suite for its time. QLoRA: only the adapters are taken back
# (DeepSpeed, whose module state also holds bitsandbytes' quantization keys); the 4-bit base is rebuilt as it was.
# FSDP2's QLoRA (only its adapters saved) passes it too and is left out for the suite's time: its sharded state is
# the one fsdp-full resumes, its job runs to the end and merges in test_sharded_qlora_merge_is_the_quantized_base. ZeRO-3 full: built partitioned from the local safetensors, its optimizer offloaded to the host.
# HSDP (a 2 x 1 mesh) saves and loads through the same sharded state as FSDP2 (its losses: test_distributed's
# test_hybrid_sharding_same_losses_as_single); left out of this test for the suite's time, as ZeRO-2 is.
@pytest.mark.parametrize("strategy,method,extra", [("fsdp", "full", ()), ("zero3", "qlora", ()),
                                                   pytest.param("zero3", "full", ("--offload", "optimizer"),
                                                                marks=pytest.mark.cpu_adam)])
def test_distributed_job_checkpointed_and_resumed(local, tmp_path, strategy, method, extra):
    common = _args(local, "--strategy", strategy, "--nproc-per-node", "2", "--batch-size", "2", "--max-steps", "8",
                   "--method", method, *extra, "--no-store", "--json", "--save-every", "4")
    whole = json.loads(cli_subprocess(*common, "--output-dir", str(tmp_path / "a"), timeout=300).stdout)
    # the uninterrupted job's own checkpoint of step 4, continued elsewhere (`latest` after a killed job: the
    # one-process tests and test_deployed_job_resumes_when_its_pod_restarts; a killed rank ends its peers:
    # test_processes)
    resume = ["--resume", str(tmp_path / "a" / "checkpoints" / "step-000004")]
    resumed = json.loads(cli_subprocess(*common, *resume, "--output-dir", str(tmp_path / "b"), timeout=300).stdout)
    assert resumed["metrics"]["job"]["resumed_from"].endswith("step-000004")
    assert resumed["metrics"]["losses"] == pytest.approx(whole["metrics"]["losses"], abs=1e-5)
    if (strategy, method) != ("fsdp", "full"):
        return
    wrong = cli_subprocess(*[a if a != "2" or i != common.index("--nproc-per-node") + 1 else "1"
                             for i, a in enumerate(common)], "--resume", "latest", "--output-dir",
                           str(tmp_path / "b"), timeout=300)
    assert wrong.returncode == 2 and "world_size" in wrong.stderr


def test_deployed_job_resumes_when_its_pod_restarts(tb, local, tmp_path):
    """The exact pod command of a Kubernetes deployment, run twice: the second pod continues the first."""
    import os

    import yaml

    out = tmp_path / "vol" / "job"
    user = _args(local, "--max-steps", "8", "--save-every", "4", "--output-dir", str(out), "--log-every", "2")
    path = tmp_path / "job.yaml"
    code, _, err = tb("deploy", "k8s", "--name", "ft", "--image", "r/tb:1", "--kind", "indexed-job", "--pvc", "vol",
                      "--max-restarts", "3", "-o", str(path), "--", *user)
    assert code == 0, err
    job = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Job"][0]
    cmd = [a.replace("$(NODE_RANK)", "0") for a in job["spec"]["template"]["spec"]["containers"][0]["command"]]
    assert cmd[:2] == ["tunebench", "train"] and "--resume" in cmd and cmd[cmd.index("--resume") + 1] == "auto"
    assert job["spec"]["backoffLimit"] == 3  # a failed pod is replaced, and resumes
    env = os.environ | {"TUNEBENCH_STORE": str(tmp_path / "vol" / "r.db")}
    first = subprocess.run([sys.executable, "-m", "tunebench.cli", *cmd[1:], "--fault", "abort@6"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode != 0 and (out / "checkpoints" / "step-000004").is_dir()
    second = subprocess.run([sys.executable, "-m", "tunebench.cli", *cmd[1:]], env=env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from" in second.stderr and (out / "model" / "config.json").is_file()
    # saving asked accelerate whether the model was a DeepSpeed engine, which imported DeepSpeed: 1.6 s and its
    # "Setting accelerator" warning in every job that saved (models.save answers without it)
    assert "real_accelerator" not in first.stderr + second.stderr
    log = tmp_path / "pod.log"
    log.write_text(second.stdout)
    code, collected, _ = tb("collect", str(log), "--store", str(tmp_path / "c.db"))
    assert code == 0 and "1 records found, 1 new" in collected


def test_a_signal_to_a_distributed_job_reaches_every_rank(local, tmp_path):
    """As a pod eviction does: SIGTERM to tunebench itself, which passes it to torchrun and its ranks."""
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "tunebench.cli", *_args(local, "--strategy", "ddp", "--nproc-per-node",
                                                                        "2", "--batch-size", "2", "--max-steps",
                                                                        "100000", "--log-every", "5", "--output-dir",
                                                                        str(out), "--json", "--no-store")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("train: step 10/"):
            p.send_signal(signal.SIGTERM)
            break
    rest, _ = p.communicate(timeout=180)
    assert p.returncode == 75
    job = json.loads(rest)["metrics"]["job"]
    assert job["exit"] == "preempted" and (out / "checkpoints" / f"step-{job['steps']:06d}" / "state.json").is_file()


def test_a_checkpoint_is_verified_before_it_is_trusted(tb, local, tmp_path):
    """A finished job is not run again; a damaged, mistyped, truncated or foreign checkpoint is refused naming it,
    before anything is built (its files' sizes are written last, in state.json)."""
    out, store = tmp_path / "out", tmp_path / "r.db"
    base = _args(local, "--output-dir", str(out), "--store", str(store))
    assert tb(*base, "--max-steps", "4", "--save-every", "2", "--warmup", "1")[0] == 0
    ck2, ck4 = out / "checkpoints" / "step-000002", out / "checkpoints" / "step-000004"
    assert json.loads((ck4 / "state.json").read_text())["files"]  # every part's size, written last

    def refused(*extra: str, needle: str) -> None:
        code, _, err = tb(*base, *extra)
        assert code == 2 and needle in err and "Traceback" not in err and "internal" not in err, err

    refused("--max-steps", "4", "--warmup", "1", "--resume", "latest", needle="nothing is left to train")
    assert Store(store).count() == 1  # no second, empty record
    state = json.loads((ck2 / "state.json").read_text())
    (ck2 / "state.json").write_text(json.dumps(state | {"step": 999}))
    refused("--max-steps", "4", "--warmup", "1", "--resume", str(ck2), needle="past this job's 4 steps")
    (ck2 / "state.json").write_text(json.dumps(state | {"losses": "many"}))
    refused("--max-steps", "6", "--warmup", "1", "--resume", str(ck2), needle="losses is str")
    (ck2 / "state.json").write_text(json.dumps(state)[:40])
    refused("--max-steps", "6", "--warmup", "1", "--resume", str(ck2), needle="state.json unreadable")
    (ck2 / "state.json").write_text(json.dumps(state))
    part = next(p for p in sorted(ck2.rglob("*")) if p.is_file() and p.name != "state.json" and p.stat().st_size > 8)
    part.write_bytes(part.read_bytes()[:8])
    refused("--max-steps", "6", "--warmup", "1", "--resume", str(ck2), needle=f"{part.relative_to(ck2)} is 8 bytes")
    assert tb(*base, "--max-steps", "6", "--warmup", "1", "--resume", "latest")[0] == 0  # the sound one continues


def test_a_damaged_tokenization_cache_is_built_again(tb, local, tmp_path, capsys):
    argv = _args(local, "--max-steps", "2", "--warmup", "1", "--no-store")
    assert tb(*argv, "--output-dir", str(tmp_path / "a"))[0] == 0
    (ids,) = (tmp_path / "cache").rglob("ids.npy")
    ids.write_bytes(ids.read_bytes()[:-16])  # cut short, as a full disk or a killed copy leaves it
    code, out, err = tb(*argv, "--output-dir", str(tmp_path / "b"))
    assert code == 0 and "damaged or from an older version: tokenizing again" in out + err, err
    (again,) = (tmp_path / "cache").rglob("ids.npy")
    assert np.load(again).shape[1] == 64  # whole again: rows of seq_len tokens


def test_the_users_tokenizer_and_model_folders_may_go_while_the_job_trains(tb, local, tmp_path, monkeypatch):
    import shutil

    from transformers import AutoTokenizer

    from tunebench.engine import loop

    model, tokenizer = tmp_path / "model", tmp_path / "tokenizer"
    shutil.copytree(local / "model", model)
    shutil.copytree(local / "model", tokenizer)
    run_loop = loop.run_loop

    def then_removed(*args, **kwargs):  # training: what the job read of the user's folders is all it gets
        shutil.rmtree(model)
        shutil.rmtree(tokenizer)
        return run_loop(*args, **kwargs)

    monkeypatch.setattr("tunebench.trainer.job.run_loop", then_removed)
    argv = [a if a != str(local / "model") else str(model) for a in _args(local)]
    code, out, err = tb(*argv, "--tokenizer", str(tokenizer), "--method", "lora", "--merge", "--max-steps", "2",
                        "--warmup", "1", "--no-store", "--output-dir", str(tmp_path / "out"))
    assert code == 0, err
    assert not model.exists() and not tokenizer.exists()
    original = AutoTokenizer.from_pretrained(local / "model")
    for saved in (".tokenizer", "adapter", "merged"):
        tok = AutoTokenizer.from_pretrained(tmp_path / "out" / saved)
        assert tok.get_vocab() == original.get_vocab() and tok.eos_token == original.eos_token
    gen = json.loads((tmp_path / "out" / "merged" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == original.eos_token_id and gen["use_cache"] is True
