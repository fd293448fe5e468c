"""tunebench's QLoRA (or bf16 LoRA) loop against HF Trainer + PEFT (+ bitsandbytes) on the identical configuration.

Each side runs in its own fresh process (its own CUDA context and peak-memory counters), one after
the other in this one job, on the same GPU, with the same model shapes, NF4 base, LoRA, optimizer,
batch, sequence length, checkpointing and step counts. Only the timed steps (after `warmup`) count.

    python benchmarks/compare/vs_hf_trainer.py --model mistral-7b --seq-len 512 --batch-size 8 [--liger] [--unsloth] \\
        [--out F]
    python benchmarks/compare/vs_hf_trainer.py --method lora ...   # a bf16 base, fused AdamW on both sides
    python benchmarks/compare/vs_hf_trainer.py --ours ckpt,ckpt+mm,none --profile ckpt   # ours three ways, one profiled
    python benchmarks/compare/vs_hf_trainer.py --model qwen3-30b-a3b --targets q_proj,k_proj,v_proj,o_proj  # targets
    python benchmarks/compare/vs_hf_trainer.py --model llama-3.1-8b --no-hf   # ours alone (a family vs Llama's cost)

`--unsloth` adds Unsloth (FastLanguageModel's 4-bit load and patched model, its own checkpointing, the same
Trainer) on a local directory of random weights it writes first (`UNSLOTH_MODELS`, default /tmp/unsloth-models);
`UNSLOTH_SITE` names a directory of its packages to put first on its process's path.

The HF side is written as a user writes it: the NF4 model (built here as from_pretrained with a
BitsAndBytesConfig would leave it: NF4 linears, the rest in bf16), peft's
prepare_model_for_kbit_training, get_peft_model, then Trainer(bf16=True, optim=paged_adamw_8bit,
gradient_checkpointing=True). With `--method lora` the base stays bf16, there is no kbit preparation, and
both sides use fused AdamW (Trainer's adamw_torch_fused). The HF side's model is what transformers gives a user:
its default attention (`--hf-attn`, SDPA, which leaves Gemma 2's attention soft-capping out) and, for a mixture of
experts loaded in 4 bits, its experts in bf16 (bitsandbytes quantizes nn.Linear layers only; tunebench quantizes
the experts too). Both sides print their first losses (the HF side logs every step for them).

`--ours` runs tunebench several ways against the same HF run: `ckpt` (every block checkpointed, as HF),
`ckpt+mm` (checkpointed blocks keep their matmuls' outputs: `ckpt_keep: matmuls`), `ckpt/2` (every other block),
`ckpt+mm1/N` (one block in N keeping its matmuls, the others their input: `ckpt_keep_every`),
`none` (no checkpointing), `ckpt+mm/fused` (`ckpt+mm` with fused AdamW, whatever the HF side's optimizer),
`ckpt+off` and `ckpt+mm+off` (those with `offload: activations`); each with `/apart` added runs the LoRA
layers sharing an input (q/k/v, gate/up) one by one as peft does (`lora_fused: false`); `/cudnn` runs SDPA's
cuDNN kernel first (`attn_kernel: cudnn`; the default keeps PyTorch's order, flash first); and any with `/ops`
added dequantizes 4-bit weights as before the Triton kernel (`TUNEBENCH_NF4_KERNEL=0`: inductor's kernel for the
torch ops); `/around` puts Hugging Face's checkpoint around the call of each block recomputed whole, as before
`ckpt_traced` (`ckpt_traced: false`; there 4-bit blocks keep bitsandbytes' layers); `/cpp` launches the compiled
graphs' kernels from inductor's C++ wrapper instead of Python (`TORCHINDUCTOR_CPP_WRAPPER=1`).
`--profile V` adds, for each variant V named, the GPU time per step by kind of kernel and the share of the step
the GPU sat idle (tunebench's step built from the runner's pieces).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the profiler of vs_plain_gpt

from trainer_clock import trainer_clock  # noqa: E402
from vs_plain_gpt import print_profiles  # noqa: E402

GIB = 1024**3


def _gib(n: int | None) -> float | None:
    return None if n is None else n / GIB


VARIANTS = {"ckpt": dict(grad_ckpt=True), "ckpt+mm": dict(grad_ckpt=True, ckpt_keep="matmuls"),
            "ckpt/2": dict(grad_ckpt=True, ckpt_every=2), "none": dict(grad_ckpt=False),
            # the adapters' optimizer as fused AdamW instead of the side's 8-bit one (a different configuration)
            "ckpt+mm/fused": dict(grad_ckpt=True, ckpt_keep="matmuls", optimizer="adamw_fused"),
            # what the forward saves for backward held in pinned host memory (offload: activations)
            "ckpt+off": dict(grad_ckpt=True, offload="activations"),
            "ckpt+mm+off": dict(grad_ckpt=True, ckpt_keep="matmuls", offload="activations")}
# one checkpointed block in N keeping its matmuls, the others only their input (ckpt_keep_every: N)
VARIANTS |= {f"ckpt+mm1/{n}": dict(grad_ckpt=True, ckpt_keep="matmuls", ckpt_keep_every=n) for n in range(2, 9)}
# each of those with the frozen base's matmuls in float8, rowwise scaled (float8: rowwise; models.float8_frozen)
VARIANTS |= {f"{name}/f8": dict(options, float8="rowwise") for name, options in list(VARIANTS.items())}
# each of those with the LoRA siblings (q/k/v, gate/up) run apart, as peft runs them (lora_fused: false)
VARIANTS |= {f"{name}/apart": dict(options, lora_fused=False) for name, options in list(VARIANTS.items())}
# each of those with SDPA's cuDNN kernel first (attn_kernel: cudnn; auto keeps PyTorch's order, flash first)
VARIANTS |= {f"{name}/cudnn": dict(options, attn_kernel="cudnn") for name, options in list(VARIANTS.items())}
# each of those with the 4-bit dequantization as before its Triton kernel (TUNEBENCH_NF4_KERNEL=0)
VARIANTS |= {f"{name}/ops": options for name, options in list(VARIANTS.items())}
# each of those with Hugging Face's checkpoint around the call of a block recomputed whole (ckpt_traced: false)
VARIANTS |= {f"{name}/around": dict(options, ckpt_traced=False) for name, options in list(VARIANTS.items())
             if options["grad_ckpt"]}
# each of those with inductor's C++ wrapper launching the compiled graphs' kernels (TORCHINDUCTOR_CPP_WRAPPER=1)
VARIANTS |= {f"{name}/cpp": options for name, options in list(VARIANTS.items())}


def _cfg(a: argparse.Namespace, variant: str | None = None):
    from tunebench import RunConfig

    cfg = RunConfig(model=a.model, method=a.method, seq_len=a.seq_len, batch_size=a.batch_size, steps=a.steps,
                     warmup=a.warmup, lora_rank=16, lora_alpha=32, lora_dropout=0.0, grad_ckpt=a.grad_ckpt,
                     lora_targets=a.targets.split(","),
                     optimizer="paged_adamw_8bit" if a.method == "qlora" else "adamw_fused", precision="bf16",
                     lr=2e-4, device=a.device, tag=["vs_hf_trainer"])
    return cfg.model_copy(update=VARIANTS[variant]) if variant else cfg


def side_ours(a: argparse.Namespace) -> dict:
    from tunebench import run

    cfg = _cfg(a, a.variant)
    rec = run(cfg)
    m = rec.metrics
    out = {"side": f"tunebench {a.variant}", "status": rec.status, "error": rec.error, "tokens_per_s": m.tokens_per_s,
           "peak_alloc_gib": _gib(m.peak_mem_allocated_bytes), "peak_reserved_gib": _gib(m.peak_mem_reserved_bytes),
           "loss_first": m.loss_first, "loss_last": m.loss_last, "setup_s": m.setup_s, "mfu": m.mfu,
           "first_losses": m.losses[:3], "trainable": m.params_trainable,
           "record": json.loads(rec.model_dump_json())}
    if a.variant in a.profile and rec.status == "ok":
        from vs_plain_gpt import _our_step, profile

        out["profile"] = profile(_our_step(cfg))
    return out


def _data(a: argparse.Namespace, vocab: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    n = a.steps * a.batch_size
    data = torch.randint(0, vocab, (n, a.seq_len), generator=gen)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": data[i], "labels": data[i]}

    return Tokens()


def _trainer_run(a: argparse.Namespace, model, side: str) -> dict:
    """HF Trainer on `model` as a user runs it, timed over the steps after `warmup`."""
    import torch
    from transformers import Trainer, TrainingArguments

    cuda = a.device == "cuda"

    clock = trainer_clock(a.warmup, a.steps, cuda)

    args = TrainingArguments(
        output_dir="/tmp/hf-trainer-bench", per_device_train_batch_size=a.batch_size, gradient_accumulation_steps=1,
        max_steps=a.steps, learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0, bf16=True,
        optim="paged_adamw_8bit" if a.method == "qlora" else "adamw_torch_fused",
        gradient_checkpointing=a.grad_ckpt and side != "unsloth", logging_steps=1, save_strategy="no",
        report_to=[], max_grad_norm=1.0, dataloader_pin_memory=cuda, use_liger_kernel=a.liger, seed=0, use_cpu=not cuda)
    trainer = Trainer(model=model, args=args, train_dataset=_data(a, model.config.vocab_size), callbacks=[clock])
    whole_run = torch.cuda.max_memory_allocated() if cuda else None  # the model's load (Unsloth's: bf16, then 4-bit)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = trainer.train()
    timed = (a.steps - a.warmup) * a.batch_size * a.seq_len
    return {"side": side, "status": "ok", "tokens_per_s": timed / clock.seconds,
            "peak_alloc_gib": max(whole_run, torch.cuda.max_memory_allocated()) / GIB if cuda else None,
            "train_peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else None,
            "train_loss": out.training_loss, "first_losses": clock.losses,
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def side_hf(a: argparse.Namespace) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    from tunebench.choices import resolve
    from tunebench.config.targets import split_targets
    from tunebench.models import resolve_model
    from tunebench.models.build import build, train_weights
    from tunebench.strategies import STRATEGIES

    cfg = _cfg(a)
    torch.manual_seed(0)
    # as transformers loads it: bitsandbytes' 4-bit nn.Linear layers, an MoE's 3-D experts left in bf16
    made = resolve(cfg, STRATEGIES[cfg.strategy], torch.device(a.device).type)  # its 'auto' precision made
    w = dataclasses.replace(train_weights(made), quantize_experts=False)
    model, _ = build(resolve_model(a.model), w, torch.device(a.device))
    model.set_attn_implementation(a.hf_attn)
    if a.method == "qlora" and a.hf_kbit_prep:  # (it casts every 16-bit parameter to fp32: an MoE's bf16 experts too)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=a.grad_ckpt)
    elif a.method == "qlora" and a.grad_ckpt:
        model.enable_input_require_grads()
    elif a.grad_ckpt:
        model.enable_input_require_grads()  # the frozen embeddings' output must carry a gradient into checkpoints
    modules, params = split_targets(a.targets.split(","))  # `experts`: peft's target_parameters, as ours
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=modules or [],
                                             target_parameters=params or None, bias="none", task_type="CAUSAL_LM"))
    return _trainer_run(a, model, "hf_trainer" + ("+liger" if a.liger else ""))


def _random_checkpoint(name: str, root: Path) -> Path:
    """A local model directory as from_pretrained reads it: the preset's config, random bf16 weights (made on the
    GPU), and a small tokenizer (the token ids fed are random: only its special tokens matter)."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from tunebench.models import resolve_model

    path = root / name
    if (path / "config.json").exists():
        return path
    aside = root / f".{name}.partial"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(resolve_model(name).hf_config, dtype=torch.bfloat16)
    model.save_pretrained(aside)
    del model
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials + [f"t{i}" for i in range(252)])}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                  unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.save_pretrained(aside)
    aside.rename(path)
    return path


def side_unsloth(a: argparse.Namespace) -> dict:
    """Unsloth as its documentation has users write it: FastLanguageModel (its 4-bit load, Triton kernels and
    patched model code), get_peft_model with its own checkpointing ("unsloth": offloaded to host), HF Trainer."""
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import unsloth  # noqa: F401  (first: it patches transformers and peft as they import)
    from unsloth import FastLanguageModel

    path = _random_checkpoint(a.model, Path(os.environ.get("UNSLOTH_MODELS", "/tmp/unsloth-models")))
    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=a.seq_len, dtype=torch.bfloat16,
                                                 load_in_4bit=a.method == "qlora", load_in_16bit=a.method == "lora",
                                                 local_files_only=True)
    model = FastLanguageModel.get_peft_model(
        model, r=16, lora_alpha=32, lora_dropout=0.0, bias="none", random_state=0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        use_gradient_checkpointing="unsloth" if a.grad_ckpt else False)
    return _trainer_run(a, model, "unsloth")


def _child(a: argparse.Namespace, side: str, liger: bool = False, variant: str = "ckpt") -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--variant", variant, "--profile", ",".join(a.profile),
           "--model", a.model, "--seq-len", str(a.seq_len),
           "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--warmup", str(a.warmup), "--device", a.device,
           "--method", a.method, "--targets", a.targets, "--hf-attn", a.hf_attn]
    cmd += [] if a.hf_kbit_prep else ["--no-hf-kbit-prep"]
    cmd += ["--grad-ckpt" if a.grad_ckpt else "--no-grad-ckpt"] + (["--liger"] if liger else [])
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    if "/ops" in variant:
        env["TUNEBENCH_NF4_KERNEL"] = "0"
    if "/cpp" in variant:
        env["TORCHINDUCTOR_CPP_WRAPPER"] = "1"
    if side == "unsloth" and os.environ.get("UNSLOTH_SITE"):  # its packages (and the datasets < 5 it pins) apart
        env["PYTHONPATH"] = os.pathsep.join((os.environ["UNSLOTH_SITE"], env.get("PYTHONPATH", "")))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"side": side, "status": "failed", "error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--method", choices=("qlora", "lora"), default="qlora")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (no memory figures)")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--liger", action="store_true", help="also run HF Trainer with use_liger_kernel=True")
    p.add_argument("--unsloth", action="store_true", help="also run Unsloth (FastLanguageModel) with HF Trainer")
    p.add_argument("--ours", help=f"tunebench's variants, comma-separated, of {', '.join(VARIANTS)} (default: "
                                  "checkpointed as the HF side is)")
    p.add_argument("--profile", default="", help="the variants of ours to profile too, comma-separated")
    p.add_argument("--variant", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--side", choices=("ours", "hf", "unsloth"), help=argparse.SUPPRESS)
    p.add_argument("--targets", default="all-linear", help="LoRA targets of both sides, comma-separated")
    p.add_argument("--hf-attn", default="sdpa", help="the HF side's attention implementation (transformers' name)")
    p.add_argument("--no-hf", action="store_true", help="tunebench alone")
    p.add_argument("--no-ours", action="store_true", help="the HF side alone")
    p.add_argument("--hf-kbit-prep", action=argparse.BooleanOptionalAction, default=True,
                   help="QLoRA's HF side through peft's prepare_model_for_kbit_training (as its recipe has it)")
    p.add_argument("--out", help="write all figures as JSON here")
    a = p.parse_args()
    a.profile = [v for v in a.profile.split(",") if v]
    ours_variants = (a.ours or ("ckpt" if a.grad_ckpt else "none")).split(",")
    if unknown := set(ours_variants + a.profile) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}: choose from {', '.join(VARIANTS)}")
    if a.side:
        side = {"ours": side_ours, "hf": side_hf, "unsloth": side_unsloth}[a.side]
        print("RESULT " + json.dumps(side(a)), flush=True)
        return
    results = [] if a.no_ours else [_child(a, "ours", variant=v) for v in ours_variants]
    results += [] if a.no_hf else [_child(a, "hf")] + ([_child(a, "hf", liger=True)] if a.liger else [])
    results += [_child(a, "unsloth")] if a.unsloth else []
    what = "QLoRA" if a.method == "qlora" else "LoRA (bf16 base)"
    print(f"\n{a.model} {what} seq {a.seq_len} batch {a.batch_size} grad_ckpt {a.grad_ckpt} "
          f"({a.steps - a.warmup} timed steps after {a.warmup} warmup)")
    hf = next((r for r in results if r["side"] == "hf_trainer"), {})
    print(f"{'side':<27}{'status':<8}{'tokens/s':>10}{'peak alloc GiB':>16}{'reserved GiB':>14}{'x HF':>8}{'mem':>7}")
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['side']:<27}{r.get('status'):<8}  {str(r.get('error', ''))[-400:]}")
            continue
        ratio = r["tokens_per_s"] / hf["tokens_per_s"] if hf.get("status") == "ok" else float("nan")
        alloc, resv = r["peak_alloc_gib"] or float("nan"), r["peak_reserved_gib"] or float("nan")
        mem = alloc / hf["peak_alloc_gib"] if hf.get("status") == "ok" and hf["peak_alloc_gib"] else float("nan")
        print(f"{r['side']:<27}{r['status']:<8}{r['tokens_per_s']:>10,.0f}{alloc:>16.2f}{resv:>14.2f}"
              f"{ratio:>8.3f}{mem:>7.3f}")
    print("x HF = that side's tokens/s / HF Trainer's (with the same checkpointing); mem = its peak allocated / HF's")
    for r in results:
        if r.get("status") == "ok":
            print(f"{r['side']}: first losses {[round(x, 4) for x in r.get('first_losses') or []]}, "
                  f"{r.get('trainable', 0):,} trainable parameters")
    for r in results:
        if r.get("train_peak_alloc_gib") is not None:
            print(f"{r['side']}: peak allocated while training {r['train_peak_alloc_gib']:.2f} GiB (loading apart)")
    print_profiles(results, top=8)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
