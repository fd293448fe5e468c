#!/usr/bin/env bash
# The GPU proofs of one topic, on a machine with GPUs, from the repository's root (figures: benchmarks/results/):
#   bash benchmarks/proofs/run.sh TOPIC
# TOPIC: one of the `case` below. It runs `tunebench sweep benchmarks/proofs/TOPIC.yaml` where that file exists
# (records exported to $OUT/TOPIC.jsonl), then its comparisons (benchmarks/compare/: each side its own process, the
# ratio printed). Wheels carried in .whl/ are installed first (.whl/unsloth-site.tgz: Unsloth's packages). Knobs:
#   ONLY=sweep|compare  one half only;  OUT  outputs and the results store (/tmp/tunebench-out)
#   dpo-head: BEFORE (a tarball of an earlier src/), CONFIGS, PROFILE=0 (the A/B without the profile), EXTRA (more
#     arguments for every run, e.g. a strategy)
#   dpo-reference-graph: JOBS=0 (the probe without the whole jobs); dpo-frozen-graph: BEFORE (as dpo-head's),
#     EXTRA (as dpo-head's), PROBE=0 (the jobs alone);
#   dpo-reference-2gpu: NPROC (2), MATCH=0 (the runs without the Gemma-2 probe)
#   SEQ, BATCH, STEPS, WARMUP  laid over every configuration of the sweep (--set) and the comparisons; NPROC: the
#   comparisons' GPUs (each suite names its own)
#   families: MODELS (qwen3-8b), METHODS (lora qlora), TARGETS (all-linear), CHECKS (family_checks.py's; none),
#     NOHF=1 tunebench alone, NOOURS=1 HF alone, NOPREP=1 HF's QLoRA without peft's kbit preparation,
#     HFATTN the HF side's attention, NAME a suffix for the output files
set -uo pipefail
topic=${1:?usage: bash benchmarks/proofs/run.sh TOPIC (see the head of this file)}
OUT=${OUT:-/tmp/tunebench-out}; mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TUNEBENCH_STORE=$OUT/results.db
unset PYTHONDONTWRITEBYTECODE  # an image without bytecode compiles torch from source in every process: cache it aside
export PYTHONPYCACHEPREFIX=/tmp/pycache
tb() { python3 -m tunebench.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
sets=()
for kv in seq_len=${SEQ:-} batch_size=${BATCH:-} steps=${STEPS:-} warmup=${WARMUP:-}; do  # GPUs: the suite's
  [ -n "${kv#*=}" ] && sets+=(--set "$kv")
done
shape() { echo "--seq-len ${SEQ:-$1} --batch-size ${BATCH:-$2} --steps ${STEPS:-$3} --warmup ${WARMUP:-$4}"; }
planned_then_run() {  # NAME ARGS...: the plan's tokens/s and peak, then the run's status, tokens/s, peak, first losses
  local name=$1; shift
  tb plan "$@" --json 2>/dev/null | python3 -c 'import json, sys
p = json.load(sys.stdin); print("planned", round(p["tokens_per_s"]), round(p["peak_mem_allocated_bytes"] / 2**30, 2), "GiB")'
  tb run "$@" --tag "$topic" --json 2>/dev/null | python3 -c 'import json, sys; r = json.load(sys.stdin); m = r["metrics"] or {}
print(sys.argv[1], r["status"], round(m.get("tokens_per_s", 0)), round((m.get("peak_mem_allocated_bytes") or 0) / 2**30, 2),
      "GiB", [round(x, 4) for x in (m.get("losses") or [])[:4]], r["error"])' "$name"
}
gemma4() {  # a local folder of Gemma-2-9B's shape cut to 4 blocks (random weights); its path
  python3 -c 'import sys; sys.path.insert(0, "benchmarks/probes"); from pathlib import Path; import long_context
print(long_context.write_model("gemma-2-9b", 4, None, Path("/tmp/models")))'
}

if [ "${ONLY:-sweep}" = sweep ] && [ -f "benchmarks/proofs/$topic.yaml" ]; then
  tb sweep "benchmarks/proofs/$topic.yaml" ${sets[@]+"${sets[@]}"} --run-timeout 900 2>&1 | grep -v "step [0-9]*/"
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null
fi
[ "${ONLY:-compare}" = compare ] || exit 0

case "$topic" in
qlora-lora)  # Mistral-7B against HF Trainer + PEFT (+ bitsandbytes), checkpointed as HF is; the kernels alone
  S=$(shape 512 8 24 8)
  python3 benchmarks/compare/vs_hf_trainer.py --method qlora $S --ours ckpt,ckpt+mm1/8,none,ckpt+off \
    --out "$OUT/vs_hf_trainer_qlora.json" 2>&1 | tail -n 12
  python3 benchmarks/compare/vs_hf_trainer.py --method qlora $S --ours ckpt/f8,ckpt+mm1/8/f8,none/f8 \
    --out "$OUT/vs_hf_trainer_qlora_f8.json" 2>&1 | tail -n 10
  python3 benchmarks/compare/vs_hf_trainer.py --method lora $S --ours ckpt,none,ckpt/f8,none/f8 \
    --out "$OUT/vs_hf_trainer_lora.json" 2>&1 | tail -n 10
  if [ -f .whl/unsloth-site.tgz ]; then  # Unsloth's packages, carried apart (its web studio left out)
    mkdir -p /tmp/usite && tar xzf .whl/unsloth-site.tgz -C /tmp/usite
    UNSLOTH_SITE=/tmp/usite python3 benchmarks/compare/vs_hf_trainer.py --method qlora $S --ours ckpt --unsloth \
      --out "$OUT/vs_unsloth_qlora.json" 2>&1 | tail -n 10
  fi
  python3 benchmarks/compare/kernels_vs.py --out "$OUT/kernels_vs.json" 2>&1 | grep -E "fwd\+bwd|device|rror"
  python3 benchmarks/compare/dequant_vs.py --out "$OUT/dequant_vs.json" 2>&1 | tail -n 12
  ;;
full-finetune)  # GPT-2 small against plain torch.compile, with GPT-2's dropout and without; eager, per block and
  # whole model train alike (losses step by step)
  python3 benchmarks/compare/vs_plain_gpt.py \
    --sides plain-compile,ours-model,plain-compile-nodrop,ours-model-pure-nodrop --out "$OUT/vs_plain_gpt.json" \
    2>&1 | tail -n 8
  python3 benchmarks/probes/scope_losses.py --steps 8 2>&1 | grep "^fp32\|^bf16"
  ;;
distributed-2gpu)  # Llama-3-8B FSDP2 (per-block checkpointing) and TinyGPT DDP against the plain scripts
  python3 benchmarks/compare/vs_plain_fsdp.py --gpus "${NPROC:-2}" --sides plain-ckpt,ours-ckpt --batch-size 2 \
    --steps 15 --warmup 5 --side-timeout 200 --out "$OUT/vs_plain_fsdp.json" 2>&1 | tail -n 4
  python3 benchmarks/compare/vs_plain_ddp.py --gpus "1,${NPROC:-2}" --sides plain-ddp,ours-ddp \
    --out "$OUT/vs_plain_ddp.json" 2>&1 | tail -n 6
  ;;
distributed-4gpu)  # TinyGPT DDP and ZeRO-2 against the plain scripts, 1 -> NPROC GPUs; Llama-3-8B FSDP2 against
  # the plain FSDP2 script, without checkpointing (both orders) and with it
  python3 benchmarks/compare/vs_plain_ddp.py --gpus "1,${NPROC:-4}" --sides plain-ddp,ours-ddp,plain-zero2,ours-zero2 \
    --out "$OUT/vs_plain_ddp.json" 2>&1 | tail -n 12
  for sides in ours,plain plain,ours plain-ckpt,ours-ckpt; do
    python3 benchmarks/compare/vs_plain_fsdp.py --gpus "${NPROC:-4}" --sides $sides --batch-size 2 --steps 20 \
      --warmup 5 --side-timeout 200 --out "$OUT/vs_plain_fsdp_${sides/,/_}.json" 2>&1 | tail -n 4
  done
  python3 benchmarks/probes/multinode_estimate.py
  ;;
long-context)  # Llama-3.1-8B QLoRA r32 b1: the chunked MLP against the traced checkpoint (four blocks, then all 32 at
  # 64k), and the longest context with the blocks' inputs offloaded (one step: ~7 minutes at 344k)
  LC="python3 benchmarks/probes/long_context.py --max-positions 1048576"
  $LC --layers 4 --steps 2 --warmup 1 --seq-lens 65536,131072 --variant "ckpt=--grad-ckpt" \
    --variant "chunk=--grad-ckpt --mlp-chunk 8192" --out "$OUT/long_context_4.json"
  $LC --steps 3 --warmup 1 --seq-lens 65536 --variant "chunk=--grad-ckpt --mlp-chunk 8192" \
    --variant "chunk+off=--grad-ckpt --mlp-chunk 8192 --offload activations" --out "$OUT/long_context_64k.json"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $LC --steps 1 --warmup 0 --seq-lens "${SEQ:-344064}" \
    --variant "chunk+off=--grad-ckpt --mlp-chunk 8192 --offload activations" --out "$OUT/long_context_max.json"
  ;;
preference)  # DPO (LoRA, QLoRA) on Llama-3.1-8B against TRL's DPOTrainer, s1024, 4 pairs a step; ours as TRL is
  # checkpointed (traced), with Hugging Face's checkpoint around the blocks, and with the kept inputs offloaded
  for m in ${METHODS:-lora qlora}; do
    python3 benchmarks/compare/dpo_vs_trl.py --method "$m" --ours "${OURS:-ckpt,ckpt/around,ckpt+off}" \
      --root /tmp/dpo-bench --out "$OUT/dpo_vs_trl_$m.json" 2>&1 | tail -n 12
  done
  ;;
families)  # each family's GPU paths against transformers', then LoRA and QLoRA against HF Trainer + PEFT
  CHECKS=${CHECKS-flex,packed,experts,expert-lora,softcap,compiled}
  [ "$CHECKS" = none ] || python3 benchmarks/compare/family_checks.py --checks "$CHECKS" \
    --out "$OUT/family_checks.json" 2>&1 | grep -E '^\{' | cut -c1-400
  for m in ${MODELS:-qwen3-8b}; do
    for meth in ${METHODS:-lora qlora}; do
      python3 benchmarks/compare/vs_hf_trainer.py --model "$m" --method "$meth" $(shape 512 8 20 8) \
        --targets "${TARGETS:-all-linear}" ${NOHF:+--no-hf} ${NOOURS:+--no-ours} ${NOPREP:+--no-hf-kbit-prep} \
        ${HFATTN:+--hf-attn "$HFATTN"} --out "$OUT/fam_${m}_${meth}${NAME:-}.json" 2>&1 | tail -n 9
    done
  done
  ;;
planner-oos-4gpu)  # the records held out from every fit, planned again as a new user would
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-long-context)  # held out as planner-oos-4gpu; then attention's kernels alone, what the planner's ceiling is
  tb plan --validate "$OUT/$topic.jsonl"
  python3 benchmarks/probes/attention_kernel.py --repeats 3 --out "$OUT/attention_kernel.json" ;;
planner-long-context-families)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-zero2)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-terms)  # held out as planner-oos-4gpu; then the profiles the planner's GPU terms are fitted on
  [ -f "$OUT/$topic.jsonl" ] && tb plan --validate "$OUT/$topic.jsonl"
  python3 benchmarks/probes/planner_terms.py --from "benchmarks/proofs/$topic.profiles" --out "$OUT/$topic-profiles.jsonl" ;;
planner-terms-7b)  # as planner-terms
  [ -f "$OUT/$topic.jsonl" ] && tb plan --validate "$OUT/$topic.jsonl"
  python3 benchmarks/probes/planner_terms.py --from "benchmarks/proofs/$topic.profiles" --out "$OUT/$topic-profiles.jsonl" ;;
planner-terms-2gpu)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-zero2-2gpu)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-dpo-2gpu)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-dpo-zero2-2gpu)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-dpo-families)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-first-block)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-first-block-2|planner-traced-full|planner-traced-full-7b)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
zero2-overflow-check)  # ZeRO-2 bf16 with DeepSpeed's overflow check (as before 2026-11-28, from a copy of src/)
  # against without it (src/ as it is), each run its own process, alternated; the ratio printed. NPROC GPUs (1),
  # STRATEGY (zero2; zero3 too), CONFIGS "model batch,..." (GPT-2 medium 8, TinyGPT 8, Llama-3.2-1B 8, 3B 2)
  rm -rf /tmp/before && mkdir -p /tmp/before && cp -r src /tmp/before/
  sed -i 's/"check_grad_overflow": False/"check_grad_overflow": True/' /tmp/before/src/tunebench/strategies/zero.py
  grep -q '"check_grad_overflow": True' /tmp/before/src/tunebench/strategies/zero.py || exit 1
  IFS=, read -ra configs <<< "${CONFIGS:-gpt2-medium 8,tinygpt-124m 8,llama-3.2-1b 8,llama-3.2-3b 2}"
  for m in "${configs[@]}"; do
    set -- $m
    for side in before after; do
      src=$PWD/src; [ $side = before ] && src=/tmp/before/src
      PYTHONPATH=/tmp/site:$src python3 -m tunebench.cli run --model "$1" --method full --strategy "${STRATEGY:-zero2}" \
        --precision bf16 --nproc-per-node "${NPROC:-1}" $(shape 1024 "$2" 14 5) --tag "zero2-check-$side" \
        --json 2>/dev/null | python3 -c 'import json, sys; r = json.load(sys.stdin)
print(sys.argv[1], sys.argv[2], r["status"], round(r["metrics"]["tokens_per_s"]))' "$1" "$side"
    done
  done | tee "$OUT/$topic.txt" | awk '{print} $2=="before"{b=$4} $2=="after"{printf "%s x%.3f (after / before)\n", $1, $4/b}'
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null ;;
dpo-head)  # Llama-3.2-1B DPO: full fine-tuning (its trained head) and LoRA (its reference without gradients), s1024
  # checkpointed; BEFORE: a tarball of an earlier commit's src/ (git archive COMMIT src | gzip) run first, each run its
  # own process, the ratio printed; then the full run's step profiled (kernels by kind, and where the GPU waits)
  sides=(after); if [ -n "${BEFORE:-}" ]; then
    rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf "$BEFORE" -C /tmp/before || exit 1; sides=(before after)
  fi
  IFS=, read -ra configs <<< "${CONFIGS:-full 4 1024,full 2 2048,lora 8 1024}"
  for m in "${configs[@]}"; do
    set -- $m
    args="--model llama-3.2-1b --method $1 --objective dpo --grad-ckpt $(shape "$3" "$2" 14 6) ${EXTRA:-}"
    tb plan $args --json 2>/dev/null | python3 -c 'import json, sys
p = json.load(sys.stdin); print(*sys.argv[1:], "planned", round(p["tokens_per_s"]), round(p["peak_mem_allocated_bytes"] / 2**30, 2))' "$1" "$2"
    for side in "${sides[@]}"; do
      src=$PWD/src; [ $side = before ] && src=/tmp/before/src
      PYTHONPATH=/tmp/site:$src python3 -m tunebench.cli run $args --tag "dpo-head-$side" --json 2>/dev/null \
        | python3 -c 'import json, sys; r = json.load(sys.stdin); m = r["metrics"] or {}
print(*sys.argv[1:], r["status"], round(m.get("tokens_per_s", 0)), round((m.get("peak_mem_allocated_bytes") or 0) / 2**30, 2),
      "GiB", (m.get("losses") or [None])[::4], r["error"])' "$1" "$2" "$side"
    done
  done | tee "$OUT/$topic.txt" | awk '{print} $3=="before"{b=$5} $3=="after"&&b{printf "%s b%s x%.3f (after / before)\n", $1, $2, $5/b; b=0}'
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null
  [ "${PROFILE:-1}" = 1 ] || exit 0  # PROFILE=0: the A/B alone
  PROFILE_TRACE=/tmp/dpo-full-trace.json python3 benchmarks/probes/profile_trace.py --model llama-3.2-1b --method full \
    --objective dpo --seq-len 1024 --batch-size 4 --grad-ckpt 2>/dev/null | tail -1 | tee "$OUT/$topic-profile.json"
  python3 benchmarks/probes/profile_trace.py --gaps /tmp/dpo-full-trace.json | tee "$OUT/$topic-gaps.txt" ;;
dpo-reference-graph)  # compiled DPO's reference through the policy's own graph: the policy-to-reference gap at the
  # start (reference_match.py) on Gemma-2-9B's shape cut to 4 blocks and on Llama-3.2-1B; then the first losses of
  # whole jobs, checkpointed (Gemma-2-9B LoRA b2, Qwen3-8B QLoRA b4, s1024), each planned first
  gemma=$(gemma4) || exit 1
  for model in "$gemma" llama-3.2-1b; do
    echo "$model"; python3 benchmarks/probes/reference_match.py --model "$model" 2>/dev/null
  done | tee "$OUT/$topic-match.txt"
  [ "${JOBS:-1}" = 1 ] || exit 0  # JOBS=0: the probe alone
  for m in "gemma-2-9b lora 2" "qwen3-8b qlora 4"; do
    set -- $m
    planned_then_run "$*" --model $1 --method $2 --objective dpo --grad-ckpt $(shape 1024 "$3" 12 5)
  done | tee "$OUT/$topic.txt"
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null ;;
dpo-frozen-graph)  # a full fine-tune's frozen DPO reference through the policy's compiled graphs, on Gemma-2-9B's
  # shape cut to 4 blocks: the policy-to-reference gap at the start (reference_match.py --method full), then the whole
  # DPO job s1024 b4 without and with checkpointing (first losses), BEFORE's src (a tarball, as dpo-head's) first
  gemma=$(gemma4) || exit 1
  sides=(after); if [ -n "${BEFORE:-}" ]; then
    rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf "$BEFORE" -C /tmp/before || exit 1; sides=(before after)
  fi
  for side in "${sides[@]}"; do
    src=$PWD/src; [ $side = before ] && src=/tmp/before/src
    echo "$side"; [ "${PROBE:-1}" = 1 ] && PYTHONPATH=/tmp/site:$src python3 benchmarks/probes/reference_match.py \
      --model "$gemma" --method full 2>/dev/null
    for ckpt in "" --grad-ckpt; do
      PYTHONPATH=/tmp/site:$src python3 -m tunebench.cli run --model "$gemma" --method full --objective dpo $ckpt \
        $(shape 1024 4 8 3) ${EXTRA:-} --tag "$topic-$side" --json 2>/dev/null | python3 -c 'import json, sys; r = json.load(sys.stdin)
m = r["metrics"] or {}; print(*sys.argv[1:], r["status"], round(m.get("tokens_per_s", 0)),
      round((m.get("peak_mem_allocated_bytes") or 0) / 2**30, 2), "GiB", (m.get("losses") or [None])[:3], r["error"])' \
        "$side" "${ckpt:-no-ckpt}"
    done
  done | tee "$OUT/$topic.txt"
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null ;;
dpo-reference-2gpu)  # the first DPO losses on two GPUs (Llama-3.2-1B s1024 checkpointed: LoRA under FSDP2 and DDP,
  # full under ZeRO-2 and FSDP2), each planned first; then a full fine-tune's frozen reference against its policy at
  # the start on Gemma-2-9B's shape cut to 4 blocks (reference_match.py --method full, on the first GPU)
  for m in "lora fsdp 4" "lora ddp 4" "full zero2 2" "full fsdp 2"; do
    set -- $m
    planned_then_run "$*" --model llama-3.2-1b --method $1 --objective dpo --grad-ckpt --strategy $2 \
      --nproc-per-node "${NPROC:-2}" $(shape 1024 "$3" 8 3)
  done | tee "$OUT/$topic.txt"
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null
  [ "${MATCH:-1}" = 1 ] || exit 0  # MATCH=0: the runs alone
  gemma=$(gemma4) || exit 1
  python3 benchmarks/probes/reference_match.py --model "$gemma" --method full 2>/dev/null | tee "$OUT/$topic-match.txt" ;;
fsdp-pure-reduce)  # Qwen3-30B-A3B full FSDP2 bf16-pure on NPROC GPUs (4), s4096 checkpointed: fp32 reduce-scatter
  # (as before 2026-11-28, from a copy of src/) against bf16 (src/ as it is) at batch 4, each its own process; then
  # bf16 at BATCHES (8 16); each planned first (the plan's line printed), records in $OUT/$topic.jsonl. LAYERS: its
  # shape cut to that many blocks (a local folder of its config), as many per GPU on fewer GPUs; AB=0 without the pair
  model=qwen3-30b-a3b
  [ -n "${LAYERS:-}" ] && model=$(python3 -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/probes")
from long_context import write_model; print(write_model("qwen3-30b-a3b", int(sys.argv[1]), None, Path("/tmp/models")))' "$LAYERS")
  rm -rf /tmp/before && mkdir -p /tmp/before && cp -r src /tmp/before/
  sed -i 's/reduce = torch.bfloat16 if cfg.precision == "bf16-pure" else torch.float32/reduce = torch.float32/' \
    /tmp/before/src/tunebench/strategies/fsdp.py
  grep -q '    reduce = torch.float32$' /tmp/before/src/tunebench/strategies/fsdp.py || exit 1
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  pair=("before 4" "after 4"); [ "${AB:-1}" = 0 ] && pair=()
  for run in ${pair[@]+"${pair[@]}"} $(for b in ${BATCHES:-8 16}; do echo "after_$b"; done); do
    set -- ${run/_/ }
    src=$PWD/src; [ "$1" = before ] && src=/tmp/before/src
    args="--model $model --method full --strategy fsdp --nproc-per-node ${NPROC:-4} --precision bf16-pure
      --grad-ckpt $(shape 4096 "$2" 10 4)"
    PYTHONPATH=/tmp/site:$src python3 -m tunebench.cli plan $args --json 2>/dev/null | python3 -c 'import json, sys
p = json.load(sys.stdin); print("planned", round(p["tokens_per_s"]), round(p["peak_mem_allocated_bytes"] / 2**30, 2), "GiB")'
    PYTHONPATH=/tmp/site:$src python3 -m tunebench.cli run $args --tag "fsdp-reduce-$1" --json 2>/dev/null \
      | python3 -c 'import json, sys; r = json.load(sys.stdin); m = r["metrics"] or {}
print(*sys.argv[1:], r["status"], round(m.get("tokens_per_s", 0)), round(100 * (m.get("mfu") or 0), 1), "% MFU",
      round((m.get("peak_mem_allocated_bytes") or 0) / 2**30, 2), "GiB", (m.get("losses") or [None])[::3], r["error"])' "$@"
  done | tee "$OUT/$topic.txt"
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null ;;
planner-memory)  # held out as planner-oos-4gpu; then (PROBES=0: not) what the planner's memory items must explain:
  # what is alive at a step's peak (full fine-tunes of tied embeddings, Phi-3.5 and Qwen2.5 QLoRA), the CUDA graphs'
  # pools of Llama-3.2-1B and 3B, a full DPO's profile
  [ -f "$OUT/$topic.jsonl" ] && tb plan --validate "$OUT/$topic.jsonl"
  [ "${PROBES:-1}" = 1 ] || exit 0
  python3 benchmarks/probes/memory_probe.py --peak-live --out "$OUT/memory_probe.jsonl" \
    "model=llama-3.2-1b method=full batch_size=4 seq_len=2048 grad_ckpt=true" \
    "model=llama-3.2-3b method=full batch_size=2 seq_len=1024 grad_ckpt=true" \
    "model=phi-3.5-mini method=qlora batch_size=4 seq_len=2048 grad_ckpt=true" \
    "model=qwen2.5-7b method=qlora batch_size=16 seq_len=512 grad_ckpt=true" > /dev/null 2>&1
  python3 -c 'import json, sys
for ln in open(sys.argv[1]):
    r = json.loads(ln); print("PROBE", r["config"], r.get("error") or [(k, round(v / 2**30, 2)) for ph in r["phases"]
          for k, v in ph.items() if not k.endswith("_s")])' "$OUT/memory_probe.jsonl"
  for m in llama-3.2-1b:4 llama-3.2-3b:2; do
    PEAK_PARTS_TRACE=1 python3 benchmarks/probes/peak_parts.py run --model "${m%:*}" --method full --seq-len 1024 \
      --batch-size "${m#*:}" --steps 8 --warmup 4 2>&1 | grep -E "^(PEAK|POOL)"
  done
  python3 benchmarks/probes/planner_terms.py --out "$OUT/$topic-profiles.jsonl" \
    "--model llama-3.2-1b --method full --seq-len 1024 --batch-size 4 --grad-ckpt --objective dpo" ;;
planner-edge)  # held out as planner-oos-4gpu
  tb plan --validate "$OUT/$topic.jsonl" ;;
planner-check)  # each record's prediction against what it measured (the sweep above stored both)
  tb report --out "$OUT/report" > /dev/null && sed -n '/^## Planner/,/^## [^P]/p' "$OUT/report/report.md" ;;
hardware-inference)  # tunebench hw (collectives too where there are several GPUs), load, infer; HF generate
  tb hw --tag proof
  tb load --model mistral-7b --precisions bf16,fp16,int8,nf4 --tag proof
  tb infer --model mistral-7b --precisions bf16,nf4 --batch-sizes 1,8,32,64 --repeats 2 --tag proof
  tb infer --model mistral-7b --precisions bf16,nf4 --batch-sizes 1,8,32 --kv-cache static --compile --tag proof
  python3 benchmarks/compare/vs_hf_generate.py --model mistral-7b --precisions bf16,nf4 --batch-sizes 1,8,32 \
    --repeats 2 --out "$OUT/vs_hf_generate.json"
  python3 benchmarks/probes/telemetry_overhead.py --pairs 3
  tb results export --format jsonl -o "$OUT/$topic.jsonl" > /dev/null
  ;;
training-jobs)  # tunebench train on the standard library's sources: from scratch; QLoRA train against run
  export TUNEBENCH_CACHE=/tmp/tbcache
  python3 benchmarks/probes/stdlib_corpus.py /tmp/corpus --vocab 32000 > /dev/null
  C="--tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --tag proof-training-jobs"
  tb train --model tinygpt-124m $C --seq-len "${SEQ:-1024}" --batch-size "${BATCH:-4}" --max-steps "${STEPS:-120}" \
    --warmup-steps 20 --grad-accum 2 --lr 1e-3 --precision bf16 --dropout 0 --eval-fraction 0.02 --eval-every 60 \
    --eval-batches 10 --log-every 20 --output-dir /tmp/gpt2-job 2>&1 | grep -E "^train:|^eval:|tokens/s  |rror"
  Q="--model mistral-7b --method qlora --seq-len 512 --batch-size 8 --grad-ckpt --optimizer paged_adamw_8bit"
  tb run $Q --steps 60 --warmup 15 --tag proof-training-jobs 2>&1 | grep "tokens/s  \|step time"
  tb train $Q $C --max-steps 60 --warmup 15 --no-packing --log-every 60 --output-dir /tmp/q-job 2>&1 \
    | grep "^train:\|tokens/s  \|step time"
  if [ "${NPROC:-1}" -ge 2 ]; then  # FSDP2 on NPROC GPUs, stopped by SIGTERM at step 30, resumed
    F="--model llama-3.2-1b $C --strategy fsdp --nproc-per-node $NPROC --seq-len 1024 --batch-size 8 --max-steps 60"
    F="$F --save-every 20 --log-every 5 --eval-fraction 0.02 --eval-every 30 --eval-batches 10 --output-dir /tmp/fsdp"
    rm -rf /tmp/fsdp
    python3 -m tunebench.cli train $F > "$OUT/fsdp-first.log" 2>&1 & job=$!
    until grep -q "train: step 3[0-9]/60" "$OUT/fsdp-first.log" || ! kill -0 $job 2>/dev/null; do sleep 1; done
    kill -TERM $job; wait $job; echo "first part exited with code $? (75: stopped by the signal, checkpoint saved)"
    tb train $F --resume latest 2>&1 | grep "^train:\|^eval:\|resum"
  fi
  ;;
gpu-tests)  # the tests that run on a GPU only (skipped on the CPU)
  python3 -m pytest -q -p no:cacheprovider tests/test_{loss,optim,nf4,offload,lora_siblings,attn_kernel}.py \
    tests/test_{float8_frozen,compile,models,attention,tf32,packed_attention,families,recompute}.py 2>&1 | tail -n 4 ;;
*) echo "unknown topic $topic: see the case in benchmarks/proofs/run.sh" >&2; exit 2 ;;
esac
