"""tunebench's DPO (LoRA or QLoRA) against TRL's DPOTrainer on the same model, data and settings.

Each side runs in its own fresh process, one after the other in this one job, on the same GPU. The parent writes a
local model directory first (the preset's shape, random bf16 weights, a word-level tokenizer), and a JSONL of
preference pairs whose prompt and answers are exactly `--prompt-len` and `seq_len - prompt_len` tokens (the answer's
end-of-sequence token included), so both sides train on rows of seq_len tokens without padding.

    python benchmarks/compare/dpo_vs_trl.py --model llama-3.1-8b --method lora --seq-len 1024 --batch-size 4 \\
        [--ours ckpt,ckpt+mm1/4] [--out F]

TRL's side is written as its documentation has users write it: from_pretrained (with a BitsAndBytesConfig for
QLoRA), a peft LoraConfig passed to DPOTrainer (the reference is the base with the adapter disabled; TRL prepares a
4-bit model for k-bit training itself), DPOConfig's defaults (gradient checkpointing and bf16 on) with the batch,
max_length, steps and learning rate given. tunebench's side is `tunebench train` (objective dpo) on the same JSONL
and model directory with the same batch, LoRA, learning rate, optimizer and checkpointing; `--ours` adds variants
(`ckpt+mm1/N`: one checkpointed block in N keeps its matmuls; `ckpt+off`: the kept inputs in host memory;
`/around`: Hugging Face's checkpoint around each block instead of the one traced inside it). pairs/s counts the
steps after `--warmup`; peak memory is torch's peak allocated while training. Both sides print their first losses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_clock import trainer_clock  # noqa: E402

GIB = 1024**3
VARIANTS = {"ckpt": dict(grad_ckpt=True), "none": dict(grad_ckpt=False),
            "ckpt+off": dict(grad_ckpt=True, offload="activations"),
            "precompute": dict(grad_ckpt=True, precompute_reference=True)}
VARIANTS |= {f"ckpt+mm1/{n}": dict(grad_ckpt=True, ckpt_keep="matmuls", ckpt_keep_every=n) for n in range(1, 9)}
# each with Hugging Face's checkpoint around the block's call (ckpt_traced: false): the block's input kept in the
# compute dtype, where the traced checkpoint keeps a wider copy
VARIANTS |= {f"{name}/around": dict(options, ckpt_traced=False) for name, options in list(VARIANTS.items())
             if options["grad_ckpt"]}
VOCAB_WORDS = 1000  # below every preset's vocabulary


def write_inputs(a: argparse.Namespace, root: Path) -> tuple[Path, Path]:
    """The model directory (random weights, a word-level tokenizer) and the pairs (tokens drawn with a seed)."""
    import random

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from tunebench.models import resolve_model

    path = root / a.model
    if not (path / "config.json").exists():
        aside = root / f".{a.model}.partial"
        torch.manual_seed(0)
        with torch.device(a.device):
            model = AutoModelForCausalLM.from_config(resolve_model(a.model).hf_config, dtype=torch.bfloat16)
        model.save_pretrained(aside)
        del model
        specials = ["<unk>", "<s>", "</s>", "<pad>"]
        vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(VOCAB_WORDS)])}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                       pad_token="<pad>")
        fast.save_pretrained(aside)
        aside.rename(path)
    rng = random.Random(0)
    words = lambda n: " ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(n))  # noqa: E731
    answer = a.seq_len - a.prompt_len - 1  # the end-of-sequence token ends each answer
    pairs = [{"prompt": words(a.prompt_len), "chosen": " " + words(answer), "rejected": " " + words(answer)}
             for _ in range((a.steps + 2) * a.batch_size)]
    data = root / f"pairs-{a.seq_len}-{a.prompt_len}.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path, data


def side_trl(a: argparse.Namespace) -> dict:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import DPOConfig, DPOTrainer

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16) if a.method == "qlora" else None
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16, quantization_config=quant)
    tok = AutoTokenizer.from_pretrained(a.model_dir)

    clock = trainer_clock(a.warmup, a.steps, cuda=True, reset_peak=True)

    args = DPOConfig(output_dir="/tmp/trl-dpo-bench", per_device_train_batch_size=a.batch_size, max_steps=a.steps,
                     max_length=a.seq_len, learning_rate=a.lr, logging_steps=1, save_strategy="no", report_to=[],
                     beta=0.1, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=load_dataset("json", data_files=a.data)["train"],
                         processing_class=tok, callbacks=[clock],
                         peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                                task_type="CAUSAL_LM"))
    out = trainer.train()
    pairs = (a.steps - a.warmup) * a.batch_size
    return {"side": "trl", "status": "ok", "pairs_per_s": pairs / clock.seconds,
            "peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB, "train_loss": out.training_loss,
            "first_losses": clock.losses, "optimizer": str(args.optim), "gradient_checkpointing":
                args.gradient_checkpointing,
            "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)}


def our_config(a: argparse.Namespace, variant: str, optimizer: str):
    from tunebench.config import TrainConfig

    return TrainConfig(model=a.model_dir, data=a.data, objective="dpo", beta=0.1, method=a.method, lora_rank=16,
                       lora_alpha=32, lora_dropout=0.0, batch_size=a.batch_size, seq_len=a.seq_len, max_steps=a.steps,
                       warmup=a.warmup, lr=a.lr, schedule="linear", optimizer=optimizer, precision="bf16",
                       output_dir=f"/tmp/ours-dpo-bench-{variant.replace('/', '-')}", overwrite=True,
                       log_every=1, **VARIANTS[variant])


def side_ours(a: argparse.Namespace) -> dict:
    from tunebench.api.train import train

    rec = train(our_config(a, a.variant, a.optimizer))
    m = rec.metrics
    return {"side": f"tunebench {a.variant}", "status": rec.status, "error": rec.error,
            "pairs_per_s": m.samples_per_s, "tokens_per_s": m.tokens_per_s,
            "peak_alloc_gib": (m.peak_mem_allocated_bytes or 0) / GIB,
            "peak_reserved_gib": (m.peak_mem_reserved_bytes or 0) / GIB, "first_losses": m.losses[:3],
            "trainable": m.params_trainable, "mfu": m.mfu, "record": json.loads(rec.model_dump_json())}


def _child(a: argparse.Namespace, side: str, variant: str = "ckpt", optimizer: str = "adamw_fused") -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--variant", variant, "--optimizer", optimizer, "--model",
           a.model, "--method", a.method, "--seq-len", str(a.seq_len), "--prompt-len", str(a.prompt_len),
           "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--warmup", str(a.warmup), "--lr", str(a.lr),
           "--model-dir", str(a.model_dir), "--data", str(a.data), "--device", a.device]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"side": side if side == "trl" else f"tunebench {variant}", "status": "failed",
                "error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


OPTIMIZERS = {"adamw_torch_fused": "adamw_fused", "adamw_torch": "adamw", "adamw_8bit": "adamw_8bit",
              "paged_adamw_8bit": "paged_adamw_8bit"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--method", choices=("qlora", "lora"), default="lora")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--device", default="cuda")
    p.add_argument("--ours", default="ckpt", help=f"tunebench's variants, comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--root", default="/tmp/dpo-bench", help="where the model directory and the pairs are written")
    p.add_argument("--no-trl", action="store_true")
    p.add_argument("--out")
    p.add_argument("--side", choices=("trl", "ours"), help=argparse.SUPPRESS)
    p.add_argument("--variant", default="ckpt", help=argparse.SUPPRESS)
    p.add_argument("--optimizer", default="adamw_fused", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        print("RESULT " + json.dumps(side_trl(a) if a.side == "trl" else side_ours(a)), flush=True)
        return
    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    a.model_dir, a.data = write_inputs(a, root)
    results = []

    def keep(r: dict) -> None:  # written after every side: a job cut short keeps what it measured
        results.append(r)
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=2))

    if not a.no_trl:
        keep(_child(a, "trl"))
    trl = results[0] if results and results[0].get("status") == "ok" else {}
    optimizer = OPTIMIZERS.get(trl.get("optimizer", "").split(".")[-1].lower(), "adamw_fused")
    for v in a.ours.split(","):
        keep(_child(a, "ours", v, optimizer))
    print(f"\n{a.model} {a.method} DPO seq {a.seq_len} (prompt {a.prompt_len}) batch {a.batch_size} pairs "
          f"({a.steps - a.warmup} timed steps after {a.warmup}); optimizer {optimizer}")
    print(f"{'side':<26}{'status':<8}{'pairs/s':>9}{'peak alloc GiB':>16}{'reserved GiB':>14}{'x TRL':>8}{'mem':>7}")
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['side']:<26}{r.get('status'):<8}  {str(r.get('error', ''))[-600:]}")
            continue
        ratio = r["pairs_per_s"] / trl["pairs_per_s"] if trl else float("nan")
        mem = r["peak_alloc_gib"] / trl["peak_alloc_gib"] if trl else float("nan")
        print(f"{r['side']:<26}{r['status']:<8}{r['pairs_per_s']:>9.3f}{r['peak_alloc_gib']:>16.2f}"
              f"{r['peak_reserved_gib']:>14.2f}{ratio:>8.3f}{mem:>7.3f}")
    print("x TRL = pairs/s over TRL's; mem = peak allocated over TRL's")
    for r in results:
        if r.get("status") == "ok":
            print(f"{r['side']}: first losses {[round(x, 4) for x in r.get('first_losses') or []]}, "
                  f"{r.get('trainable', 0):,} trainable parameters")


if __name__ == "__main__":
    main()
