"""The model families' GPU paths against their references, on the GPU (values and gradients; no timing).

    python benchmarks/compare/family_checks.py [--device cuda] [--out F]

  flex      Gemma 2's attention as tunebench runs it on a GPU (FlexAttention: the soft-cap a score modification, its
            causal and sliding-window masks block-sparse) against transformers' eager attention (the reference that
            soft-caps): a tiny Gemma 2 model's loss and every gradient, fp32 and bf16
  experts   the 4-bit experts (models.experts4bit, the Triton dequantization and torch's grouped GEMM) against
            transformers' experts holding the dequantized weights: outputs and the input's gradient, bf16
  packed    packed rows under that attention: an example packed after another gets the logits it gets alone
  softcap   the fused loss with Gemma 2's final soft-cap, bf16 on the GPU (its compiled softmax), against
            cross-entropy over the capped fp32 logits
  expert-lora  LoRA on the experts applied to the routed tokens (grouped GEMMs of rank r) against peft's rebuilt
            expert weights: a tiny Qwen3-MoE's loss and its expert adapters' gradients, bf16, ranks 16 and 4
  compiled  a tiny Qwen3-MoE's QLoRA and LoRA (its experts adapted) and a tiny Gemma 2's LoRA, blocks compiled
            against eager: losses step by step
Each check prints its largest difference and whether it is within its bound; the exit code is 1 if any is not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0)


def _gemma2(impl: str, dtype: torch.dtype, device: str):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(**TINY, head_dim=64, sliding_window=64, query_pre_attn_scalar=64)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=dtype).to(device)


def check_flex(device: str) -> list[dict]:
    out = []
    ids = torch.randint(0, 512, (2, 256), generator=torch.Generator().manual_seed(0)).to(device)
    for dtype, bound in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        grads = {}
        for impl in ("eager", "flex_attention"):
            model = _gemma2(impl, dtype, device).train()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            grads[impl] = (loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()})
        (le, ge), (lf, gf) = grads["eager"], grads["flex_attention"]
        worst = max(((gf[n] - ge[n]).norm() / ge[n].norm().clamp(min=1e-12)).item() for n in ge)
        out.append({"check": f"flex {str(dtype)[6:]}", "loss_eager": le.item(), "loss_flex": lf.item(),
                    "worst_grad_rel": worst, "ok": abs((lf - le).item()) <= bound and worst <= 10 * bound})
    return out


def check_packed(device: str) -> list[dict]:
    """Packed rows under Gemma 2's FlexAttention: an example packed after another gets the logits it gets alone (no
    attention crosses examples; transformers builds the block mask from the restarted position ids)."""
    model = _gemma2("flex_attention", torch.float32, device).eval()
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 512, (100,), generator=gen), torch.randint(3, 512, (156,), generator=gen)
    ids = torch.cat([a, b])[None].to(device)
    positions = torch.cat([torch.arange(100), torch.arange(156)])[None].to(device)
    with torch.no_grad():
        together = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 100:]
        alone = model(input_ids=b[None].to(device), use_cache=False).logits[0]
    worst = (together - alone).abs().max().item()
    return [{"check": "flex packed rows", "worst": worst, "ok": worst < 1e-3}]


def check_experts(device: str) -> list[dict]:
    import copy

    import bitsandbytes.functional as bf
    import transformers

    from tunebench.models.experts4bit import WEIGHTS, quantize_experts

    cfg = transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                                      norm_topk_prob=True, head_dim=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device)
    quantized = copy.deepcopy(model)
    quantize_experts(quantized, torch.bfloat16, "nf4", True)
    ref, ours = model.model.layers[0].mlp.experts, quantized.model.layers[0].mlp.experts
    with torch.no_grad():
        for w in WEIGHTS:
            getattr(ref, w).copy_(bf.dequantize_4bit(getattr(ours, w).data, getattr(ours, w).quant_state))
            getattr(ref, w).requires_grad_(False)
    x = torch.randn(4096, 256, dtype=torch.bfloat16, device=device, requires_grad=True)
    index = torch.randint(0, 16, (4096, 4), device=device)
    weights = torch.rand(4096, 4, dtype=torch.bfloat16, device=device)
    expected, got = ref(x, index, weights), ours(x, index, weights)
    g = torch.randn_like(got)
    gx_ref, gx = torch.autograd.grad(expected, x, g)[0], torch.autograd.grad(got, x, g)[0]
    rel = ((got - expected).float().norm() / expected.float().norm()).item()
    rel_g = ((gx - gx_ref).float().norm() / gx_ref.float().norm()).item()
    return [{"check": "experts 4-bit", "out_rel": rel, "grad_rel": rel_g, "ok": rel <= 1e-2 and rel_g <= 1e-2}]


def check_expert_lora(device: str) -> list[dict]:
    """LoRA on the experts applied to the routed tokens (methods.expert_adapters: torch's grouped GEMMs of rank r)
    against peft's own path (the expert weights rebuilt with their adapters), both in bf16 (fp32 adapters under
    autocast) and each measured against peft's path in fp32: the loss and the expert adapters' gradients, ranks 16
    and 4 (padded to 8)."""
    import copy
    import warnings

    import transformers
    from peft import LoraConfig, get_peft_model

    from tunebench.methods.expert_adapters import use_grouped_expert_adapters
    from tunebench.models.experts import use_autocast_experts

    cfg = transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                                      norm_topk_prob=True, head_dim=64)
    out = []
    for rank in (16, 4):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg).to(device)
        use_autocast_experts(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exact = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
        for name, prm in exact.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(prm, std=0.02)
        sides = {"exact": exact}
        for side in ("peft", "ours"):
            m = copy.deepcopy(exact)
            for name, prm in m.named_parameters():
                if "lora_" not in name:
                    prm.data = prm.data.to(torch.bfloat16)
            sides[side] = m
        routed = use_grouped_expert_adapters(sides["ours"])
        ids = torch.randint(0, 512, (4, 512), device=device)
        res = {}
        for side, m in sides.items():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=side != "exact"):
                loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            res[side] = (loss.item(), {n: p.grad.float() for n, p in m.named_parameters()
                                       if "experts" in n and p.grad is not None})
        exact_loss, exact_grads = res["exact"]

        def worst(grads: dict, exact: dict = exact_grads) -> float:
            return max(((g - exact[n]).norm() / exact[n].norm()).item() for n, g in grads.items())

        row = {"check": f"expert lora r{rank}", "routed": routed, "loss_fp32": exact_loss,
               "loss_peft_bf16": res["peft"][0], "loss_bf16": res["ours"][0], "grads": len(res["ours"][1]),
               "grad_rel_worst_peft_bf16": worst(res["peft"][1]), "grad_rel_worst_bf16": worst(res["ours"][1])}
        # as close to fp32 as peft's own bf16 path is (or within 2%)
        row["ok"] = (routed == 2 and row["grads"] == 8 and abs(row["loss_bf16"] - exact_loss) < 1e-2
                     and row["grad_rel_worst_bf16"] <= max(1.5 * row["grad_rel_worst_peft_bf16"], 2e-2))
        out.append(row)
    return out


def check_softcap(device: str) -> list[dict]:
    from tunebench.engine.loss import causal_lm_loss

    torch.manual_seed(0)
    h = (torch.randn(4096, 256, device=device) * 3).requires_grad_()
    head = torch.nn.Linear(256, 256000, bias=False, device=device)
    y = torch.randint(0, 256000, (4096,), device=device)
    z = 30.0 * torch.tanh(head(h) / 30.0)
    ref = F.cross_entropy(z, y)
    ref_h, ref_w = torch.autograd.grad(ref, (h, head.weight))
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = causal_lm_loss(h, head, y, 256000, softcap=30.0)
    got_h, got_w = torch.autograd.grad(loss, (h, head.weight))
    rel_h = ((got_h - ref_h).norm() / ref_h.norm()).item()
    rel_w = ((got_w - ref_w).norm() / ref_w.norm()).item()
    return [{"check": "softcap loss bf16", "loss_ref": ref.item(), "loss": loss.item(), "grad_h_rel": rel_h,
             "grad_w_rel": rel_w, "ok": abs(loss.item() - ref.item()) < 2e-2 and rel_h < 3e-2 and rel_w < 3e-2}]


def check_compiled(device: str, root: Path) -> list[dict]:
    import transformers

    from tunebench import RunConfig, run

    out = []
    specs = {"qwen3moe": transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=128, num_experts=16,
                                                     num_experts_per_tok=4, norm_topk_prob=True, head_dim=64),
             "gemma2": transformers.Gemma2Config(**TINY, head_dim=64, sliding_window=64, query_pre_attn_scalar=64)}
    for name, method in (("qwen3moe", "qlora"), ("gemma2", "lora"), ("qwen3moe", "lora")):
        cfg = specs[name]
        path = root / name
        if not (path / "config.json").exists():
            torch.manual_seed(0)
            transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
        losses = {}
        for compile_ in (False, True):
            rec = run(RunConfig(model=str(path), method=method, steps=6, warmup=2, seq_len=256, batch_size=4,
                                lr=1e-3, device=device, compile=compile_, grad_ckpt=True, telemetry=False))
            losses[compile_] = rec.metrics.losses if rec.status == "ok" else rec.error
        ok = all(isinstance(v, list) for v in losses.values())
        worst = max(abs(a - b) for a, b in zip(losses[False], losses[True])) if ok else None
        out.append({"check": f"compiled {name} {method}", "eager": losses[False], "compiled": losses[True],
                    "worst": worst, "ok": ok and worst < 2e-2})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--checks", default="flex,packed,experts,expert-lora,softcap,compiled")
    p.add_argument("--root", default="/tmp/family-checks", help="where the tiny local models are written")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args()
    results = []
    for name in a.checks.split(","):
        fn = {"flex": check_flex, "experts": check_experts, "softcap": check_softcap, "packed": check_packed,
              "expert-lora": check_expert_lora}.get(name)
        try:
            rows = fn(a.device) if fn else check_compiled(a.device, Path(a.root))
        except Exception as err:  # one failing check still lets the others report
            rows = [{"check": name, "ok": False, "error": f"{type(err).__name__}: {str(err)[:400]}"}]
        for r in rows:
            print(json.dumps(r), flush=True)
        results += rows
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
