"""Preference objectives (dpo, simpo, orpo) on the CPU, against TRL where TRL has the same thing.

The losses, rewards and gradients equal TRL's on one batch (DPOTrainer whole, CPOTrainer's SimPO and ORPOTrainer's
loss functions on the same log-probabilities); a preference task is learned (chosen: counting words in order,
rejected: the same words scrambled); the record's eval loss equals one computed apart from the saved adapter and the
base; a resumed job equals an uninterrupted one; packed pairs give the loss of pairs apart; chat pairs are the
template's tokens, trained on the last answer only, with damaged rows counted.
"""

import contextlib
import json
import random
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import COUNTING, cli_subprocess, counting_model, free_port
from tunebench.cli import main

CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def _pair(rng: random.Random) -> dict:
    a, k = rng.randrange(0, 6), rng.randrange(3, 6)
    good = COUNTING[a:a + k]
    bad = good[:]
    while bad == good:
        rng.shuffle(bad)
    return {"prompt": COUNTING[a - 1] if a else "count", "chosen": " " + " ".join(good),
            "rejected": " " + " ".join(bad)}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local Llama-shaped model with a BPE tokenizer, training and held-out pairs (held out: other draws)."""
    root = tmp_path_factory.mktemp("pref")
    counting_model(root)
    rng = random.Random(0)
    for name, n in (("pairs.jsonl", 240), ("held.jsonl", 40)):
        (root / name).write_text("".join(json.dumps(_pair(rng)) + "\n" for _ in range(n)))
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))


def _train(local, out, *extra: str) -> dict:
    store = () if "--store" in extra else ("--no-store",)
    p = cli_subprocess("train", "--model", str(local / "model"), "--data", str(local / "pairs.jsonl"), "--seq-len",
                       "32", "--batch-size", "8", "--device", "cpu", "--precision", "fp32", "--output-dir", str(out),
                       *store, "--json", *extra, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


# --- against TRL -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_batch(local):
    """TRL's DPOTrainer built on the local model (LoRA with non-zero adapters: policy and reference differ), and
    one batch of its own tokenization."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tok = AutoTokenizer.from_pretrained(local / "model")
    pairs = [json.loads(x) for x in (local / "pairs.jsonl").read_text().splitlines()[:6]]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(local / "model", dtype=torch.float32)
    args = DPOConfig(output_dir=str(local / "trl"), per_device_train_batch_size=6, report_to=[], use_cpu=True,
                     bf16=False, max_length=64, gradient_checkpointing=False, dataset_num_proc=None)
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs), processing_class=tok,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                init_lora_weights=False))
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer, batch, pairs, tok


def _our_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's batch as tunebench's rows: the same ids, labels on the completions' tokens (shifted)."""
    ids, completion = batch["input_ids"], batch["completion_mask"].bool()
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = torch.where(completion[:, 1:], ids[:, 1:], -100)
    return ids, labels


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def _close(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys() and ours
    for n in ours:
        torch.testing.assert_close(ours[n], theirs[n], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_equals_trls_dpo_trainer(trl_batch, loss_type):
    """DPOTrainer's own loss (its reference: the adapters disabled), its rewards and its gradients."""
    from tunebench.engine.preference import Preference, PreferenceLM

    trainer, batch, _, _ = trl_batch
    trainer.loss_types = [loss_type]
    trainer._metrics["train"].clear()
    model = trainer.model
    model.train()
    theirs = trainer.compute_loss(model, batch)
    theirs.backward()
    their_grads = _grads(model)
    ours_module = PreferenceLM(model, model.config.vocab_size, Preference("dpo", beta=0.1, dpo_loss=loss_type))
    ours_module.collect = []
    ours = ours_module(*_our_batch(batch))
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-6)
    assert float(ours.detach()) != pytest.approx(np.log(2), abs=1e-3)  # policy and reference differ
    _close(_grads(model), their_grads)
    stats = ours_module.collect[0]
    metrics = trainer._metrics["train"]
    assert float(stats.chosen_rewards.mean()) == pytest.approx(metrics["rewards/chosen"][-1], abs=1e-6)
    assert float((stats.chosen_rewards - stats.rejected_rewards).mean()) == pytest.approx(
        metrics["rewards/margins"][-1], abs=1e-6)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_a_trained_heads_log_probabilities_and_gradients_are_autograds(softcap):
    """Full fine-tuning's head: each token's log-probability, and the gradients of a weighted sum of them for the
    hidden states, the weight and the bias, equal autograd's through the plain head. Chunks of 7 tokens (grouped for
    the head's gradient), 100 rows (padded in the pass); without gradients the same values."""
    from tunebench.engine.answer_logps import _TrainedHeadLogps, token_logps

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100)
    h = torch.randn(50, 16, requires_grad=True)
    y, weights = torch.randint(0, 100, (50,)), torch.randn(50)
    z = head(h)
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    theirs = z.log_softmax(-1).gather(1, y[:, None]).squeeze(1)
    (theirs * weights).sum().backward()
    expected = [t.grad.clone() for t in (h, head.weight, head.bias)]
    for t in (h, head.weight, head.bias):
        t.grad = None
    ours = _TrainedHeadLogps.apply(h, head.weight, head.bias, y, 7, torch.float32, softcap)
    (ours * weights).sum().backward()
    torch.testing.assert_close(ours, theirs.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip((h.grad, head.weight.grad, head.bias.grad), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(token_logps(h, head, y, 100, softcap=softcap), theirs.detach(), atol=1e-5,
                                   rtol=1e-5)


def _trl_logps(model, batch, average: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chosen and rejected answers' log-probabilities as TRL's CPO/ORPO trainers compute them (get_batch_logps on the
    model's logits), and the chosen answers' mean NLL over their tokens."""
    from trl.experimental.cpo import CPOTrainer

    ids, labels = _our_batch(batch)
    logits = model(input_ids=ids).logits
    full = torch.cat([torch.full_like(labels[:, :1], -100), labels[:, :-1]], 1)  # unshifted, as TRL takes them
    logps = CPOTrainer.get_batch_logps(logits, full, average_log_prob=average)
    half = ids.shape[0] // 2
    nll = F.cross_entropy(logits[:half].flatten(0, 1), labels[:half].flatten(), ignore_index=-100)
    return logps[:half], logps[half:], nll


@pytest.mark.parametrize("objective,smoothing", [("simpo", 0.0), ("simpo", 0.2), ("orpo", 0.0), ("dpo", 0.2)])
def test_simpo_orpo_and_conservative_dpo_equal_trls_loss_functions(trl_batch, objective, smoothing):
    """SimPO: CPOTrainer.cpo_loss (loss_type simpo, no NLL term); ORPO: ORPOTrainer.odds_ratio_loss, the NLL taken over
    the answers' tokens (TRL's counts the prompt's too); conservative DPO (label smoothing): CPOTrainer's sigmoid
    loss of the reference-relative log-ratios. Loss, rewards and gradients."""
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer

    from tunebench.engine.preference import Preference, PreferenceLM

    trainer, batch, _, _ = trl_batch
    model = trainer.model
    beta, gamma = (2.0, 0.7) if objective == "simpo" else (0.1, 0.5)
    fake = types.SimpleNamespace(beta=beta, label_smoothing=smoothing, simpo_gamma=gamma, alpha=0.0,
                                 loss_type="simpo" if objective == "simpo" else "sigmoid",
                                 accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    c, r, nll = _trl_logps(model, batch, average=objective != "dpo")
    if objective == "orpo":
        losses, cr, rr, _, _ = ORPOTrainer.odds_ratio_loss(fake, c, r)
        theirs = nll - losses.mean()
    elif objective == "simpo":
        losses, cr, rr = CPOTrainer.cpo_loss(fake, c, r)
        theirs = losses.mean()
    else:
        with torch.no_grad(), model.disable_adapter():
            c0, r0, _ = _trl_logps(model, batch, average=False)
        losses, cr, rr = CPOTrainer.cpo_loss(fake, c - c0, r - r0)
        theirs = losses.mean()
    theirs.backward()
    their_grads = _grads(model)
    ours_module = PreferenceLM(model, model.config.vocab_size,
                               Preference(objective, beta=beta, label_smoothing=smoothing, simpo_gamma=gamma))
    ours_module.collect = []
    ours = ours_module(*_our_batch(batch))
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-6)
    _close(_grads(model), their_grads)
    stats = ours_module.collect[0]
    torch.testing.assert_close(stats.chosen_rewards.reshape(-1), cr.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(stats.rejected_rewards.reshape(-1), rr.detach(), atol=1e-6, rtol=1e-5)


def test_our_pairs_are_trls_tokens(trl_batch, tmp_path):
    """The same text pairs tokenized by tunebench's data path and by DPOTrainer: the same ids, the same answer
    tokens trained."""
    from tunebench.config import TrainConfig
    from tunebench.data.prepare import split_and_prepare

    trainer, _, pairs, tok = trl_batch
    (tmp_path / "six.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    prepared, _ = split_and_prepare(TrainConfig(data=str(tmp_path / "six.jsonl"), objective="dpo", seq_len=32), tok)
    ids, labels, _ = prepared.arrays()
    theirs = trainer.train_dataset
    for k in range(len(pairs)):
        for side, name in ((0, "chosen_ids"), (1, "rejected_ids")):
            want = theirs[k]["prompt_ids"] + theirs[k][name]
            assert list(ids[k, side, :len(want)]) == want
            trained = [i + 1 for i, x in enumerate(labels[k, side]) if x != -100]
            assert trained == list(range(len(theirs[k]["prompt_ids"]), len(want)))


# --- training jobs -----------------------------------------------------------------------------------------------


def test_a_preference_task_is_learned_and_the_eval_loss_is_the_saved_adapters(local, tmp_path):
    """DPO with LoRA: held-out reward accuracy above 90%, the rewards in the record; the record's final eval loss
    equals DPO's loss computed here from the saved adapter (policy) and the base (reference), pair by pair."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rec = _train(local, tmp_path / "out", "--objective", "dpo", "--method", "lora", "--lora-rank", "8", "--lr",
                 "5e-3", "--beta", "0.5", "--max-steps", "30", "--eval-data", str(local / "held.jsonl"),
                 "--eval-every", "15", "--store", str(tmp_path / "r.db"), "--track", "tensorboard")
    job = rec["metrics"]["job"]
    assert job["preference"]["reward_accuracy"] > 0.9 and job["preference"]["pairs"] == 40
    assert job["preference"]["reward_margin"] > 0.5 and job["eval_perplexity"] is None
    assert [s for s, _ in job["preference_curve"]] == [0, 15, 30]
    assert job["preference_curve"][0][1]["reward_accuracy"] == 0.0  # the policy starts as the reference
    assert list((tmp_path / "out" / "tensorboard").glob("events.*"))
    assert main(["report", "--store", str(tmp_path / "r.db"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "preference jobs" in md and f"{job['preference']['reward_accuracy']:.1%}" in md
    tok = AutoTokenizer.from_pretrained(local / "model")
    base = AutoModelForCausalLM.from_pretrained(local / "model", dtype=torch.float32)
    policy = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter").eval()

    def logp(prompt: str, answer: str) -> float:
        p = tok(prompt)["input_ids"]
        ids = p + tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        logits = policy(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        return float(logits[torch.arange(len(p) - 1, len(ids) - 1), torch.tensor(ids[len(p):])].sum())

    losses = []
    with torch.no_grad():
        for row in map(json.loads, (local / "held.jsonl").read_text().splitlines()):
            pi = logp(row["prompt"], row["chosen"]) - logp(row["prompt"], row["rejected"])
            with policy.disable_adapter():
                ref = logp(row["prompt"], row["chosen"]) - logp(row["prompt"], row["rejected"])
            losses.append(-F.logsigmoid(torch.tensor(0.5 * (pi - ref))))
    assert job["eval_loss"] == pytest.approx(float(torch.stack(losses).mean()), abs=1e-5)


def test_resumed_equals_uninterrupted_with_the_reference_precomputed(local, tmp_path):
    """Full fine-tuning with the reference's log-probabilities computed before the first step: a job killed after
    its checkpoint resumes with the values kept then (its model has trained since) and ends as the whole job."""
    common = ("--objective", "dpo", "--method", "full", "--precompute-reference", "--lr", "1e-3", "--max-steps", "8",
              "--save-every", "4")
    whole = _train(local, tmp_path / "a", *common)
    p = cli_subprocess("train", "--model", str(local / "model"), "--data", str(local / "pairs.jsonl"), "--seq-len",
                       "32", "--batch-size", "8", "--device", "cpu", "--precision", "fp32", "--output-dir",
                       str(tmp_path / "b"), "--no-store", *common, "--fault", "raise@5", timeout=300)
    assert p.returncode != 0 and (tmp_path / "b" / "reference" / "train.npy").is_file()
    resumed = _train(local, tmp_path / "b", *common, "--resume", "latest")
    assert resumed["metrics"]["job"]["resumed_from"].endswith("step-000004")
    assert resumed["metrics"]["losses"] == pytest.approx(whole["metrics"]["losses"], abs=1e-6)
    assert whole["metrics"]["losses"][0] == pytest.approx(np.log(2), abs=1e-6)  # the model is its reference
    assert whole["metrics"]["losses"][-1] < 0.6
    (tmp_path / "b" / "reference" / "train.npy").unlink()  # a full fine-tune cannot ask its trained model again
    p = cli_subprocess("train", "--model", str(local / "model"), "--data", str(local / "pairs.jsonl"), "--seq-len",
                       "32", "--batch-size", "8", "--device", "cpu", "--precision", "fp32", "--output-dir",
                       str(tmp_path / "b"), "--no-store", *common, "--max-steps", "12", "--resume", "latest",
                       timeout=300)
    assert p.returncode != 0 and "reference log-probabilities precomputed at the job's start are missing" in p.stderr


def test_packed_pairs_give_the_loss_of_pairs_apart(local, tmp_path):
    """Six pairs in one packed row pair, or six row pairs: the same loss (SimPO: the policy alone decides it), through
    the job's own build and batches; no pair attends to another's tokens."""
    from transformers import AutoTokenizer

    from tunebench.config import TrainConfig
    from tunebench.data.batches import eval_batches
    from tunebench.data.prepare import fullest_row_of, split_and_prepare
    from tunebench.dist import DistContext
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    six = tmp_path / "six.jsonl"
    six.write_text("".join(x + "\n" for x in (local / "pairs.jsonl").read_text().splitlines()[:6]))
    tok = AutoTokenizer.from_pretrained(local / "model")
    losses = []
    for seq, pack, batch in ((16, False, 6), (128, True, 1)):
        cfg = TrainConfig(model=str(local / "model"), data=str(six), objective="simpo", method="full", seq_len=seq,
                          packing=pack, batch_size=batch, device="cpu", precision="fp32")
        rows, _ = split_and_prepare(cfg, tok)
        assert rows.rows == (1 if pack else 6)
        t = build_trainable(preflight(cfg), Outcome(), DistContext(), masked_labels=True,
                            per_row=fullest_row_of(rows) if pack else 1)
        with torch.no_grad():
            losses.append(float(t.module(*next(eval_batches(rows, batch, torch.device("cpu"))))))
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


def test_chat_pairs_train_on_the_last_answer_and_damaged_rows_are_counted(tmp_path):
    """Conversations through the chat template: a pair's ids are the template's (prompt and answer rendered whole),
    only the final assistant message's tokens train (an earlier assistant turn is context), the prompt may be
    implicit (shared by both conversations); a pair whose answer is not the assistant's is dropped and counted."""
    from transformers import AutoTokenizer

    from tunebench.config import TrainConfig
    from tunebench.data.prepare import split_and_prepare

    counting_model(tmp_path, chat_template=CHATML)
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    for s in ("<|im_start|>", "<|im_end|>"):
        tok.add_special_tokens({"additional_special_tokens": [s]})
    prompt = [{"role": "user", "content": "one two"}, {"role": "assistant", "content": "three"},
              {"role": "user", "content": "four"}]
    rows = [{"prompt": prompt, "chosen": [{"role": "assistant", "content": "five six"}],
             "rejected": [{"role": "assistant", "content": "six five"}]},
            {"chosen": prompt + [{"role": "assistant", "content": "five six"}],
             "rejected": prompt + [{"role": "assistant", "content": "six five"}]},
            {"prompt": prompt, "chosen": [{"role": "user", "content": "five"}],
             "rejected": [{"role": "assistant", "content": "six"}]}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared, _ = split_and_prepare(TrainConfig(data=str(tmp_path / "chat.jsonl"), objective="dpo", seq_len=64,
                                                max_bad_rows=0.5), tok)
    assert prepared.stats["examples"] == 2 and prepared.stats["bad_rows"] == {
        "an answer's last message is not the assistant's": 1}
    ids, labels, _ = prepared.arrays()
    context = len(tok(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)["input_ids"])
    for k in range(2):
        for side, answer in ((0, "five six"), (1, "six five")):
            want = tok(tok.apply_chat_template(prompt + [{"role": "assistant", "content": answer}], tokenize=False),
                       add_special_tokens=False)["input_ids"]
            assert list(ids[k, side, :len(want)]) == want
            assert [int(x) for x in labels[k, side] if x != -100] == want[context:]  # the answer and its turn's end


# DDP (replicas, the reference whole on each) takes the same losses too; left out for the suite's time
@pytest.mark.parametrize("strategy,method", [("fsdp", "full")])
def test_two_processes_take_the_losses_of_one(tmp_path, strategy, method):
    """DPO on 2 processes against one with the whole batch: FSDP2 with its frozen reference sharded like the model
    (built on meta, each rank drawing its shards of the same weights: the first loss is log 2)."""
    argv = ["run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--steps", "4", "--warmup", "1",
            "--method", method, "--precision", "fp32", "--lr", "5e-3", "--objective", "dpo", "--no-store", "--json"]
    one = cli_subprocess(*argv, "--batch-size", "2", timeout=300)
    two = cli_subprocess(*argv, "--strategy", strategy, "--nproc-per-node", "2", "--batch-size", "1", timeout=300)
    assert one.returncode == two.returncode == 0, two.stderr[-3000:]
    a, b = json.loads(one.stdout)["metrics"], json.loads(two.stdout)["metrics"]
    assert a["losses"][0] == pytest.approx(np.log(2), abs=1e-6) and abs(a["losses"][-1] - a["losses"][0]) > 1e-3
    assert b["losses"] == pytest.approx(a["losses"], abs=1e-5)
    assert b["samples_per_s"] and b["timed_tokens"] == 2 * a["timed_tokens"] // 2  # pairs' two rows each


def test_fsdp_lora_dpo_with_the_reference_precomputed_starts_at_log_2_in_bf16(local, tmp_path):
    """FSDP2's root takes the precomputed reference's answer sums as they are: cast to bf16 with the forward's
    inputs, they were rounded (the first loss off log 2 on two processes, where one process and DDP start at it)."""
    p = cli_subprocess("train", "--model", str(local / "model"), "--data", str(local / "pairs.jsonl"), "--seq-len",
                       "32", "--batch-size", "4", "--device", "cpu", "--precision", "bf16", "--output-dir",
                       str(tmp_path), "--no-store", "--json", "--objective", "dpo", "--method", "lora",
                       "--precompute-reference", "--max-steps", "1", "--strategy", "fsdp", "--nproc-per-node", "2",
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["metrics"]["losses"][0] == pytest.approx(np.log(2), abs=1e-7)


def test_zero2_full_dpo_in_bf16_starts_at_log_2():
    """DeepSpeed runs the policy in bf16, its buffers left in fp32; the frozen reference is cast alike, so at the
    start the two are one function and the loss is log 2 bit for bit."""
    p = cli_subprocess("run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "64", "--steps", "1", "--warmup",
                       "0", "--method", "full", "--precision", "bf16", "--objective", "dpo", "--strategy", "zero2",
                       "--nproc-per-node", "2", "--batch-size", "2", "--no-store", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["metrics"]["losses"][0] == pytest.approx(np.log(2), abs=1e-7)


@pytest.mark.parametrize("argv,needle", [
    (("--beta", "0.2"), "beta=0.2 is for objective dpo or simpo or orpo"),
    (("--objective", "simpo", "--precompute-reference"), "precompute_reference=True is for objective dpo"),
    (("--objective", "dpo", "--compile-scope", "model"), "compile_scope=model with objective=dpo"),
    (("--objective", "dpo", "--strategy", "zero3", "--nproc-per-node", "2"), "set precompute_reference: true"),
])
def test_refusals(tb, argv, needle):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--method", "full", *argv, "--no-store")
    assert code == 2 and needle in err


def test_gamma_is_simpo_gamma_in_a_config_file(tb, tmp_path):
    """SimPO's paper calls its margin gamma, TRL simpo_gamma: a config file may say either, not both apart."""
    from tunebench.config import load_config

    path = tmp_path / "simpo.yaml"
    path.write_text("model: tiny-llama\nobjective: simpo\nbeta: 2.0\ngamma: 1.2\n")
    assert load_config(path).simpo_gamma == 1.2
    path.write_text("model: tiny-llama\nobjective: simpo\ngamma: 1.2\nsimpo_gamma: 0.5\n")
    code, _, err = tb("plan", str(path), "--gpu", "H100")
    assert code == 2 and "gamma=1.2 and simpo_gamma=0.5 are one setting" in err


def test_sft_data_or_objective_mismatch_is_one_line(tb, local, tmp_path):
    code, _, err = tb("train", "--model", str(local / "model"), "--data", str(local / "pairs.jsonl"), "--device",
                      "cpu", "--seq-len", "32", "--output-dir", str(tmp_path / "o"), "--no-store")
    assert code == 2 and "preference pairs (chosen, rejected): train them with objective dpo" in err
    (tmp_path / "text.jsonl").write_text('{"text": "one two"}\n')
    code, _, err = tb("train", "--model", str(local / "model"), "--data", str(tmp_path / "text.jsonl"), "--device",
                      "cpu", "--seq-len", "32", "--objective", "orpo", "--output-dir", str(tmp_path / "o"), "--no-store")
    assert code == 2 and "no field prompt+chosen+rejected" in err


def test_the_planner_counts_both_rows_the_reference_and_its_copy():
    """plan: a pair is two rows; DPO adds its reference's forward (unless precomputed) and, for full fine-tuning,
    the frozen copy's weights (sharded under FSDP2); SimPO and ORPO neither."""
    from tunebench.config import RunConfig
    from tunebench.gpus import gpu_named
    from tunebench.plan import predict

    gpu = gpu_named("H100-80GB")
    base = dict(model="llama-3.2-1b", seq_len=1024, batch_size=4, grad_ckpt=True)
    sft = predict(RunConfig(**base, method="lora"), gpu)
    for objective in ("simpo", "orpo", "dpo"):
        p = predict(RunConfig(**base, method="lora", objective=objective), gpu)
        assert p.tokens_per_step == 2 * sft.tokens_per_step
        assert ("reference forward" in p.time.parts) == (objective == "dpo")
    pre = predict(RunConfig(**base, method="lora", objective="dpo", precompute_reference=True), gpu)
    assert "reference forward" not in pre.time.parts and pre.flops_per_token < p.flops_per_token
    # compiled, the reference is the policy's forward with its adapters scaled by zero: their products run in it too
    eager = predict(RunConfig(**base, method="lora", objective="dpo", compile=False), gpu)
    compiled = predict(RunConfig(**base, method="lora", objective="dpo", compile=True), gpu)
    assert compiled.workload.reference_runs_adapters and not eager.workload.reference_runs_adapters
    assert not predict(RunConfig(**base, method="full", objective="dpo", compile=True), gpu).workload \
        .reference_runs_adapters

    def copy_bytes(**kw) -> float:
        plan = predict(RunConfig(**base, method="full", objective="dpo", **kw), gpu, kw.get("nproc_per_node", 1))
        return sum(i.bytes for i in plan.mem.items if i.name == "reference model")

    whole = copy_bytes()
    assert whole == pytest.approx(4 * predict(RunConfig(**base, method="full"), gpu).workload.counts.total)
    assert copy_bytes(strategy="fsdp", nproc_per_node=4) == pytest.approx(whole / 4)
    assert copy_bytes(precompute_reference=True) == 0


@pytest.mark.parametrize("strategy,precision,dtype", [("zero2", "bf16", torch.bfloat16), ("single", "bf16", torch.float32),
                                                      ("ddp", "bf16", torch.float32), ("zero2", "fp32", torch.float32)])
def test_the_frozen_reference_computes_in_the_dtype_the_policy_does(strategy, precision, dtype):
    """DeepSpeed casts the policy to bf16 and runs it without autocast: DPO's frozen copy is cast alike (left in
    fp32, its forward ran in fp32, far below its planned speed: benchmarks/results/preference.md), and the planner
    counts it so. Under autocast the copy stays as built, as the policy's weights do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tunebench.config import RunConfig
    from tunebench.gpus import gpu_named
    from tunebench.plan import predict
    from tunebench.runner import reference_model
    from tunebench.strategies import STRATEGIES

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2))
    cfg = RunConfig(model="llama-3.2-1b", method="full", objective="dpo", strategy=strategy, precision=precision,
                    nproc_per_node=2 if strategy != "single" else 1, device="cpu")
    reference = reference_model(model, cfg, STRATEGIES[strategy], torch.device("cpu"), 1, 2, None)
    assert {p.dtype for p in reference.parameters()} == {dtype}
    # DeepSpeed casts the policy's parameters only: RoPE's inverse frequencies stay fp32 in both (cast to bf16 in the
    # copy alone, a ZeRO-2 full DPO job started away from log 2)
    assert {b.dtype for b in reference.buffers()} == {torch.float32}
    plan = predict(cfg.model_copy(update={"device": "auto"}), gpu_named("H100-80GB"), cfg.nproc_per_node)
    copy = sum(i.bytes for i in plan.mem.items if i.name == "reference model")
    assert copy == dtype.itemsize * plan.workload.counts.total


def test_compiled_reference_is_the_policys_own_graph_with_its_adapters_scaled_by_zero(tmp_path, no_codegen):
    """Compiled LoRA DPO: the reference runs the policy's graph (methods.adapter_gate), not one of its own without
    gradients or adapters, whose fusions rounded apart from the policy's and, on Gemma-2's shape (scaled embeddings,
    soft caps), moved the first loss from log 2. At the start (B = 0) the policy is its reference bit for bit and the
    loss is log 2; with B trained the reference does not move; it keeps no gradient. The adapters' dropout on: it
    does not reach adapters scaled by zero, so the reference needs no eval mode (another graph). Traced and
    partitioned without inductor's code generation: the graphs' count is what tells one graph from two."""
    from torch._dynamo.utils import counters
    from transformers import Gemma2Config

    from tunebench.config import RunConfig
    from tunebench.dist import DistContext
    from tunebench.engine.data import SyntheticPairs
    from tunebench.engine.model import unwrap
    from tunebench.engine.step import autocast, kernel_settings
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    Gemma2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=128, sliding_window=32,
                 query_pre_attn_scalar=32).save_pretrained(tmp_path)
    cfg = RunConfig(model=str(tmp_path), method="lora", objective="dpo", batch_size=2, seq_len=64, compile=True,
                    grad_ckpt=True, precision="bf16", device="cpu", lora_dropout=0.1)
    plan = preflight(cfg)
    t = build_trainable(plan, Outcome(), DistContext())
    lm, batch = t.module, SyntheticPairs(plan.spec.vocab_size, 2, 64, plan.device, 0).next()[:4]
    counters.clear()
    with kernel_settings(plan.cfg, plan.device), autocast(plan.cfg, plan.device):
        reference = lm.reference_logps(*batch)
        graphs = counters["stats"]["unique_graphs"]
        policy = lm._logps(unwrap(lm.model), *batch)[0].sums
        assert counters["stats"]["unique_graphs"] == graphs > 0  # the policy's pass compiled nothing new
        assert torch.equal(policy.detach(), reference) and not reference.requires_grad
        assert float(lm(*batch).detach()) == pytest.approx(np.log(2), abs=1e-7)
        lm.mode = "reference"  # precomputed before training, without gradients: still training's graph
        with torch.no_grad():
            assert torch.equal(lm(*batch), reference) and counters["stats"]["unique_graphs"] == graphs
        lm.mode = "train"
        with torch.no_grad():
            for name, param in lm.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.05)
        assert torch.equal(lm.reference_logps(*batch), reference)
        assert not torch.equal(lm._logps(unwrap(lm.model), *batch)[0].sums.detach(), reference)


@contextlib.contextmanager
def _one_rank_group(monkeypatch):
    """A gloo process group of one rank in this process, for what FSDP2 shards (taken down after)."""
    import torch.distributed as dist

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_compiled_frozen_copy_runs_the_policys_own_graph(tmp_path, no_codegen, monkeypatch, strategy):
    """Compiled full DPO: the frozen copy runs the policy's compiled graph (its blocks' recompute traced as the
    policy's, in training's grad and train mode, nothing saved; under FSDP2 sharded as the policy), not one of its
    own without gradients, whose fusions rounded apart from the policy's on Gemma-2's shape (the GPU's figures:
    benchmarks/results/preference.md); so does the model itself where the reference is precomputed. The graphs are
    traced and partitioned as compiled, without inductor's code generation: what is checked is that no second graph
    exists. At the start the loss is log 2; a backward reaches the policy alone."""
    from torch._dynamo.utils import counters
    from transformers import Gemma2Config

    from tunebench.config import RunConfig
    from tunebench.dist import DistContext
    from tunebench.engine.data import SyntheticPairs
    from tunebench.engine.step import autocast, kernel_settings
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    Gemma2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=128, sliding_window=32,
                 query_pre_attn_scalar=32).save_pretrained(tmp_path)
    cfg = RunConfig(model=str(tmp_path), method="full", objective="dpo", batch_size=2, seq_len=64, compile=True,
                    grad_ckpt=True, precision="bf16", device="cpu", strategy=strategy)
    group = _one_rank_group(monkeypatch) if strategy == "fsdp" else contextlib.nullcontext()
    with group:
        plan = preflight(cfg)
        t = build_trainable(plan, Outcome(), DistContext())
        lm, batch = t.module, SyntheticPairs(plan.spec.vocab_size, 2, 64, plan.device, 0).next()[:4]
        copy = lm._reference[0].model
        torch._dynamo.reset()  # graphs compiled by an earlier test of the same blocks' code would be reused
        counters.clear()
        with kernel_settings(plan.cfg, plan.device), autocast(plan.cfg, plan.device):
            reference = lm.reference_logps(*batch)
            graphs = counters["stats"]["unique_graphs"]
            loss = lm(*batch)
            assert counters["stats"]["unique_graphs"] == graphs > 0  # the policy's pass compiled nothing new
            assert float(loss.detach()) == pytest.approx(np.log(2), abs=1e-7) and not reference.requires_grad
            loss.backward()
            assert all(p.grad is None for p in copy.parameters())
            assert all(p.grad is not None for p in lm.model.parameters() if p.requires_grad)
            lm._reference.clear()  # precomputing: the model itself, before it trains, in training's graph
            lm.mode = "reference"
            with torch.no_grad():
                assert torch.equal(lm(*batch), reference) and counters["stats"]["unique_graphs"] == graphs


def test_answer_sums_are_index_adds_in_one_order_with_empty_slots_and_gradients():
    """Each answer's sum as index_add computes it (whose atomic adds on a GPU sum in any order), from differences of
    an fp64 running sum: values and gradients, answers of no tokens included (a packed row's unused slots)."""
    from tunebench.engine.answer_logps import _answer_sums

    g = torch.Generator().manual_seed(0)
    slot = torch.tensor([0, 0, 0, 2, 2, 3, 5, 5, 5, 5])
    values = (-20 * torch.rand(10, generator=g, dtype=torch.float64)).float().requires_grad_()
    sums, counts = _answer_sums(values, slot, 7)
    want = torch.zeros(7).index_add(0, slot, values)
    assert torch.allclose(sums, want, atol=1e-5) and counts.tolist() == [3, 0, 2, 1, 0, 4, 0]
    weights = torch.randn(7, generator=g)
    (grad,) = torch.autograd.grad((sums * weights).sum(), values)
    assert torch.equal(grad, weights[slot])
