"""`tunebench eval` on a GPU: the harness's own HF model class (HFLM, what `eval` runs) against a log-likelihood
wrapper written directly over the same loaded model; then `train --eval-tasks` end to end.

Nothing is downloaded. Made here, in --work: a byte-level BPE tokenizer trained on the words used below, a model
folder of a preset's shapes (random weights, bf16) with that tokenizer, and two lm-evaluation-harness task YAML
files over local JSONL files:
  passages   multiple choice as HellaSwag asks it: a passage of about --context words, four endings of about
             --answer words each (acc and acc_norm); the throughput workload
  next_word  which number word comes next ("two three four" -> five), learnable from the counting text the
             training job reads
Sides, each in its own process, one after the other, at each --batch-sizes:
  hflm    tunebench.evaluate.run_eval: lm-eval's HFLM around the model tunebench loads (the harness's time)
  direct  simple_evaluate over the same tasks with DirectLM below: requests sorted longest first, right-padded
          batches, one forward each, log-probabilities gathered on the continuations (its forward time too)
Both must give the same accuracy (bf16 may flip a near tie); examples/s and the ratio are printed.

    python benchmarks/compare/eval_vs_hflm.py [--model llama-3.2-1b] [--docs 1000] [--batch-sizes 8,32]
        [--train-steps 150] [--out F]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(SRC))
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def make_inputs(a: argparse.Namespace, work: Path) -> None:
    """Tokenizer, model folder, counting text and both tasks, written once into `work`."""
    if (work / "model" / "config.json").is_file():
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from tunebench.models import resolve_model

    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "gu", "shi"]
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(3000)})
    counting = []
    for _ in range(4000):
        s, n = rng.randrange(0, 8), rng.randrange(3, 6)
        counting.append(" ".join(NUMBERS[s:s + n]))
    (work / "tasks").mkdir(parents=True, exist_ok=True)
    (work / "count.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in counting))

    def sentence(n: int) -> str:
        return " ".join(rng.choices(words, k=max(1, int(rng.gauss(n, n / 4)))))

    docs = [{"context": sentence(a.context), "endings": [sentence(a.answer) for _ in range(4)],
             "label": rng.randrange(4)} for _ in range(a.docs)]
    (work / "tasks" / "passages.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (work / "tasks" / "passages.yaml").write_text(
        "task: passages\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: passages.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
        "doc_to_choice: '{{endings}}'\ndoc_to_target: '{{label}}'\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    rows = []
    for s in range(len(NUMBERS) - 3):
        wrong = rng.sample([w for i, w in enumerate(NUMBERS) if i != s + 3], 2)
        rows.append({"question": " ".join(NUMBERS[s:s + 3]), "choices": [NUMBERS[s + 3], *wrong], "answer": 0})
    (work / "tasks" / "next.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    (work / "tasks" / "next.yaml").write_text(
        "task: next_word\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: next.jsonl\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")

    config = resolve_model(a.model).hf_config
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 1, 2
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(counting + words, trainers.BpeTrainer(
        vocab_size=min(8000, config.vocab_size), special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    torch.manual_seed(0)
    aside = work / "model.part"
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(aside)
    fast.save_pretrained(aside)
    aside.rename(work / "model")


def direct_lm(model, tok, batch: int, device: str):
    """A harness LM that scores (context, continuation) pairs straight on `model`, as HFLM encodes them."""
    import torch
    import torch.nn.functional as F
    from lm_eval.api.model import LM

    from tunebench.metrics.timer import synchronize

    class DirectLM(LM):
        def __init__(self) -> None:
            super().__init__()
            self.forward_s = 0.0

        def _encode(self, ctx: str, cont: str) -> tuple[list[int], list[int]]:
            spaces = len(ctx) - len(ctx.rstrip())  # as HFLM: a context's trailing spaces go to the continuation
            if spaces:
                ctx, cont = ctx[:-spaces], ctx[-spaces:] + cont
            whole = tok(ctx + cont, add_special_tokens=False).input_ids
            head = tok(ctx, add_special_tokens=False).input_ids
            return head, whole[len(head):]

        @torch.no_grad()
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            pairs = [self._encode(*r.args) for r in requests]
            order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
            out: list[tuple[float, bool] | None] = [None] * len(pairs)
            for at in range(0, len(order), batch):
                rows = order[at:at + batch]
                seqs = [(pairs[i][0] + pairs[i][1])[:-1] for i in rows]
                width = max(map(len, seqs))
                ids = torch.zeros(len(rows), width, dtype=torch.long)
                for j, s in enumerate(seqs):
                    ids[j, :len(s)] = torch.tensor(s)
                synchronize(torch.device(device))
                t0 = time.perf_counter()
                logp = F.log_softmax(model(ids.to(device)).logits.float(), dim=-1)
                synchronize(torch.device(device))
                self.forward_s += time.perf_counter() - t0
                for j, i in enumerate(rows):
                    cont = pairs[i][1]
                    at_cont = len(seqs[j]) - len(cont)
                    picked = logp[j, at_cont:len(seqs[j])]
                    target = torch.tensor(cont, device=device)
                    out[i] = (float(picked.gather(-1, target[:, None]).sum()),
                              bool((picked.argmax(-1) == target).all()))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("multiple-choice tasks only")

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("multiple-choice tasks only")

    return DirectLM()


def side(a: argparse.Namespace) -> dict:
    """One side in this process: the model loaded (untimed), the passages task scored (timed)."""
    import torch

    from tunebench.config import EvalConfig
    from tunebench.evaluate import run_eval
    from tunebench.evaluate.subjects import subjects
    from tunebench.evaluate.tasks import build

    work = Path(a.work)
    cfg = EvalConfig(model=str(work / "model"), tasks=[str(work / "tasks" / "passages.yaml")],
                     batch_size=a.batch, device=a.device, precision="bf16" if a.device == "cuda" else "fp32")
    tasks = build(cfg.tasks, False)
    if a.side == "hflm":
        rec = next(iter(run_eval(cfg, lambda s: None, tasks=tasks)))
        m = rec.metrics
        seconds, scores = m.eval_s, {k: v["value"] for k, v in m.scores.items()}
        forward = None
    else:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        from tunebench.evaluate.harness import _read

        dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
        model, tok = subjects(cfg.model, False, lambda s: None)[0].load(dtype, a.device)
        lm = direct_lm(model, tok, a.batch, a.device)
        t0 = time.perf_counter()
        res = simple_evaluate(model=lm, tasks=tasks, log_samples=False, task_manager=TaskManager(
            include_defaults=False), random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        seconds = time.perf_counter() - t0
        scores = {k: v["value"] for k, v in _read(res)[0].scores.items()}
        forward = lm.forward_s
    cuda = a.device == "cuda"
    return {"side": a.side, "batch": a.batch, "seconds": seconds, "examples_per_s": a.docs / seconds,
            "forward_s": forward, "scores": scores,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "gpu": torch.cuda.get_device_name() if cuda else "cpu"}


def run_side(a: argparse.Namespace, name: str, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--side", name, "--batch", str(batch), "--work", a.work, "--docs", str(a.docs),
           "--model", a.model, "--device", a.device]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.side_timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"side": name, "batch": batch, "status": "failed", "error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


def train_with_eval(a: argparse.Namespace) -> dict:
    """`tunebench train --method lora --eval-tasks next.yaml`: the job scores its base and its fine-tuned model."""
    work = Path(a.work)
    store = work / "train.db"
    cmd = [sys.executable, "-m", "tunebench.cli", "train", "--model", str(work / "model"), "--data",
           str(work / "count.jsonl"), "--method", "lora", "--seq-len", "64", "--batch-size", "16", "--lr", "2e-3",
           "--max-steps", str(a.train_steps), "--warmup", "5", "--output-dir", str(work / "job"), "--store",
           str(store), "--eval-tasks", str(work / "tasks" / "next.yaml"), "--device", a.device]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.side_timeout)
    wall = time.perf_counter() - t0
    print("\n".join(ln for ln in (proc.stdout + proc.stderr).splitlines()
                    if "eval" in ln or "rror" in ln or "saved" in ln)[-3000:], flush=True)
    from tunebench.store import Store

    evals = list(Store(store).records(kind="eval"))
    return {"command": " ".join(cmd[2:]), "exit_code": proc.returncode, "wall_s": wall,
            "scores": {r.metrics.role: r.metrics.value for r in evals}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--docs", type=int, default=1000)
    p.add_argument("--context", type=int, default=150, help="words a passage has, on average")
    p.add_argument("--answer", type=int, default=20, help="words an ending has, on average")
    p.add_argument("--batch-sizes", default="8,32")
    p.add_argument("--train-steps", type=int, default=150)
    p.add_argument("--work", default="/tmp/eval-bench")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (with --model tiny-llama)")
    p.add_argument("--side-timeout", type=float, default=600)
    p.add_argument("--out")
    p.add_argument("--side", choices=["hflm", "direct"], help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        print("RESULT " + json.dumps(side(a)), flush=True)
        return
    make_inputs(a, Path(a.work))
    results: dict = {"model": a.model, "docs": a.docs, "date": time.strftime("%Y-%m-%d"), "sides": []}

    def save() -> None:
        if a.out:
            Path(a.out + ".tmp").write_text(json.dumps(results, indent=2))
            Path(a.out + ".tmp").replace(a.out)

    for batch in (int(b) for b in a.batch_sizes.split(",")):
        pair = [run_side(a, name, batch) for name in ("hflm", "direct")]
        results["sides"] += pair
        save()
        for r in pair:
            print(json.dumps(r), flush=True)
        if all("seconds" in r for r in pair):
            h, d = pair
            print(f"batch {batch}: hflm {h['examples_per_s']:.1f} examples/s, direct {d['examples_per_s']:.1f} "
                  f"(direct/hflm {h['seconds'] / d['seconds']:.2f}x; direct's forward {d['forward_s']:.1f} of "
                  f"{d['seconds']:.1f} s); acc hflm {h['scores'].get('acc')} direct {d['scores'].get('acc')}",
                  flush=True)
    if a.train_steps:
        results["train"] = train_with_eval(a)
        save()
        print(json.dumps(results["train"]), flush=True)


if __name__ == "__main__":
    main()
