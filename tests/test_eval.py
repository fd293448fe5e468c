"""`tunebench eval` and `train --eval-tasks`: a tiny model trained here scores above its base on a local
multiple-choice task made here, the scores equal lm-evaluation-harness's own run of the same model, and bad
input is one line with nothing stored."""

import json
import random

import pytest

from conftest import COUNTING as WORDS
from conftest import counting_model
from tunebench.store import Store

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local Llama-shaped model with random weights, counting data, and a next-word task as YAML + JSONL."""
    root = tmp_path_factory.mktemp("eval")
    rng = random.Random(0)
    counting_model(root, rng=rng, chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                                  "{% endfor %}")
    tasks = root / "tasks"
    tasks.mkdir()
    rows = []
    for a in range(7):  # 'two three four' -> five, among two words that do not come next
        wrong = rng.sample([w for i, w in enumerate(WORDS) if i != a + 3], 2)
        rows.append({"question": " ".join(WORDS[a:a + 3]), "choices": [WORDS[a + 3], *wrong], "answer": 0})
    (tasks / "next.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    (tasks / "next.yaml").write_text(
        "task: next_word\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: next.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))


def _train(tb, local, out, *extra):
    return tb("train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--seq-len", "64",
              "--batch-size", "4", "--lr", "3e-3", "--device", "cpu", "--precision", "fp32", "--max-steps", "40",
              "--warmup", "1", "--output-dir", str(out), *extra)


@pytest.fixture(scope="module")
def trained(local, tmp_path_factory):
    """A LoRA job (adapter only, scored on its base) with --eval-tasks, run once for the tests below."""
    import os

    from tunebench.cli import main

    root = tmp_path_factory.mktemp("trained")
    os.environ["TUNEBENCH_CACHE"] = str(root / "cache")
    try:
        code = main(["train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--seq-len",
                     "64", "--batch-size", "4", "--lr", "1e-2", "--device", "cpu", "--precision", "fp32",
                     "--max-steps", "40", "--warmup", "1", "--method", "lora", "--lora-rank", "16",
                     "--output-dir", str(root / "out"), "--store", str(root / "r.db"),
                     "--eval-tasks", str(local / "tasks" / "next.yaml")])
    finally:
        os.environ.pop("TUNEBENCH_CACHE", None)
    assert code == 0
    return root


def test_train_scores_the_trained_model_and_its_base(trained):
    recs = Store(trained / "r.db").records()
    job = next(r for r in recs if r.kind == "train")
    evals = {r.metrics.role: r for r in recs if r.kind == "eval"}
    assert set(evals) == {"fine-tuned", "base"}
    assert all(e.metrics.train_record == job.id and e.metrics.task == "next_word" for e in evals.values())
    assert evals["fine-tuned"].metrics.samples == 21 and evals["fine-tuned"].metrics.metric == "acc"
    assert evals["fine-tuned"].metrics.value > evals["base"].metrics.value + 0.2  # it learned to count
    listed = {e["role"]: e for e in job.metrics.job.evaluations}
    assert listed["fine-tuned"]["record"] == evals["fine-tuned"].id
    assert json.loads((trained / "out" / "record.json").read_text())["metrics"]["job"]["evaluations"]


def test_scores_equal_the_harness_own_run(trained, local, monkeypatch):
    """lm-evaluation-harness loading the base and the adapter itself (its `peft` argument) scores the same."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    recs = Store(trained / "r.db").records()
    ours = next(r for r in recs if r.kind == "eval" and r.metrics.role == "fine-tuned").metrics
    monkeypatch.chdir(local / "tasks")  # the harness reads a task's relative data files from the current folder
    theirs = simple_evaluate(model="hf", model_args={"pretrained": str(local / "model"), "peft": str(
        trained / "out" / "adapter"), "tokenizer": str(trained / "out" / "adapter"), "dtype": "float32"},
        tasks=["next_word"], task_manager=TaskManager(include_path=str(local / "tasks"), include_defaults=False),
        device="cpu", batch_size=8, log_samples=False)
    assert theirs["results"]["next_word"]["acc,none"] == pytest.approx(ours.value, abs=1e-9)


def test_eval_of_an_output_dir_an_adapter_and_the_report(tb, trained, local, tmp_path):
    store = tmp_path / "r.db"
    code, out, err = tb("eval", str(trained / "out"), "--tasks", str(local / "tasks" / "next.yaml"), "--limit", "6",
                        "--device", "cpu", "--store", str(store), "--json")
    assert code == 0, err
    recs = json.loads(out)
    assert [r["metrics"]["role"] for r in recs] == ["fine-tuned", "base"]
    assert all(r["metrics"]["samples"] == 6 and r["kind"] == "eval" for r in recs)
    job_id = json.loads((trained / "out" / "record.json").read_text())["id"]
    assert all(r["metrics"]["train_record"] == job_id for r in recs)
    code, out, err = tb("eval", str(trained / "out" / "adapter"), "--tasks", str(local / "tasks" / "next.yaml"),
                        "--device", "cpu", "--no-store")
    assert code == 0 and "next_word" in out and "acc" in out, err
    code, _, err = tb("report", "--store", str(trained / "r.db"), "--out", str(tmp_path / "rep"))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert code == 0 and "next_word" in md and "fine-tuned" in md and "base" in md, md[-3000:]
    job = next(line for line in md.splitlines() if "| ok, completed |" in line)  # the job's own row: its scores
    assert "next_word acc" in job and "adapter" in job


def test_bad_input_is_one_line_and_stores_nothing(tb, local, tmp_path):
    store = tmp_path / "r.db"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((local / "model" / "config.json").read_text())
    task = str(local / "tasks" / "next.yaml")
    narrow = tmp_path / "narrow"  # the tokenizer (58 tokens) on a model of 32 embeddings
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2)).save_pretrained(narrow)
    AutoTokenizer.from_pretrained(local / "model").save_pretrained(narrow)
    cases = [(("eval", str(narrow), "--tasks", task), "more than the model's 32 embeddings"),
             (("eval", str(local / "model"), "--tasks", "hellasawg"), "no such task in lm-evaluation-harness "
                                                                      "(close: hellaswag"),
             (("eval", str(local / "model"), "--tasks", "arc_easy"), "its dataset is not in the local cache"),
             (("eval", str(empty), "--tasks", task), "holds no weights"),
             (("eval", str(tmp_path / "gone"), "--tasks", task), "no such folder"),
             (("eval", str(local / "model"), "--tasks", str(tmp_path / "missing.yaml")), "no such task file"),
             (("eval", str(local / "model")), "missing tasks: give --tasks"),
             (("train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--device", "cpu", "--seq-len", "64",
               "--output-dir", str(tmp_path / "o"), "--eval-tasks", "hellasawg"), "close: hellaswag")]
    for argv, needle in cases:
        code, _, err = tb(*argv, "--store", str(store))
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not store.exists() and not (tmp_path / "o").exists()


def test_a_benchmark_report_says_how_to_train_score_and_export(tb, tmp_path, local):
    import re
    import shlex

    from tunebench.cli import build_parser
    from tunebench.config import TrainConfig
    from tunebench.flags import config_from

    store = tmp_path / "r.db"
    assert tb("run", "--model", "tiny-llama", "--method", "lora", "--device", "cpu", "--steps", "3", "--warmup", "1",
              "--seq-len", "16", "--store", str(store))[0] == 0
    assert tb("report", "--store", str(store), "--out", str(tmp_path / "rep"))[0] == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    command = re.search(r"`(tunebench train [^`]+)`", md[md.index("## Next steps"):]).group(1)
    assert "--method lora" in command and "--eval-tasks TASKS --merge" in command
    argv = shlex.split(command.replace("YOUR.jsonl", str(local / "text.jsonl")).replace("TASKS", "next_word"))[1:]
    cfg = config_from(build_parser().parse_args(argv), TrainConfig)  # the command as given is a valid job
    assert cfg.method == "lora" and cfg.merge and cfg.eval_tasks == ["next_word"]
    assert "tunebench export runs/job --format gguf" in md
