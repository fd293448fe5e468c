#!/usr/bin/env bash
# GPU proof runs, sent to a device machine with .whl carried (figures and commands: benchmarks/RESULTS.md).
#   bash benchmarks/gpu_proof.sh core      # issue 2: tinygpt-124m full bf16, mistral-7b QLoRA vs HF Trainer
#   bash benchmarks/gpu_proof.sh single    # tinygpt-124m eager/compile + QLoRA vs HF Trainer (GPU 0 only)
#   bash benchmarks/gpu_proof.sh scale8    # issue 3: tinygpt-124m, batch 8/GPU, 4 strategies at 1,2,4 GPUs
#   bash benchmarks/gpu_proof.sh scale1x4  # issue 3: the seeds' config, batch 1 x accum 4, same grid
#   bash benchmarks/gpu_proof.sh llama8b   # issue 3: llama-3-8b full fine-tune, FSDP2, 4 GPUs
#   bash benchmarks/gpu_proof.sh sweeps    # issue 4: the diagnostic suite (mistral-7b QLoRA), then tunebench quick
#   bash benchmarks/gpu_proof.sh consistency  # issue 4: the seeds' optimised QLoRA config on each local GPU
#   bash benchmarks/gpu_proof.sh telemetry # issue 6 (part): NVML telemetry on a run, and its overhead
#   bash benchmarks/gpu_proof.sh hw1       # issue 6: tunebench hw (full sweep) on GPU 0, then load mistral-7b
#   bash benchmarks/gpu_proof.sh infer     # issue 6: tunebench infer mistral-7b, and our decode loop vs HF generate
#   bash benchmarks/gpu_proof.sh hw4       # issue 6: tunebench hw collectives across every local GPU (4 H200)
#   bash benchmarks/gpu_proof.sh train1    # issue 13: stdlib corpus from scratch; Mistral-7B QLoRA train vs run
#   bash benchmarks/gpu_proof.sh train2    # issue 13: an FSDP2 job on 2 GPUs, stopped by SIGTERM, resumed
#   bash benchmarks/gpu_proof.sh probe     # issue 16: memory by phase and kernel time by kind (the planner's truth)
#   bash benchmarks/gpu_proof.sh tune1     # issue 16: FSDP2+ckpt on one GPU, plan and tune Mistral-7B QLoRA
#   bash benchmarks/gpu_proof.sh tune4     # issue 16: tune the strategy of TinyGPT on 4 GPUs
#   bash benchmarks/gpu_proof.sh plaingpt  # issue 14: GPT-2 small full, ours (eager, per block, whole model) vs plain, harness overhead
#   bash benchmarks/gpu_proof.sh scope7b   # issue 14: Mistral-7B QLoRA, compile per block vs whole model
#   bash benchmarks/gpu_proof.sh plancheck # issue 16: configurations the planner never saw, on an H100 (out of sample)
#   bash benchmarks/gpu_proof.sh hw100     # issue 16: the H100's matmul ceiling and bandwidth, for the planner
#                                          #   (SECTIONS, DTYPES: bf16; HWFLAGS: more hw flags, e.g. --quick)
#   bash benchmarks/gpu_proof.sh attn1     # the registered SDPA on every path of one GPU: decode, FSDP2, ZeRO-2
#   bash benchmarks/gpu_proof.sh free7b    # issue 14: Mistral-7B QLoRA memory free (no checkpointing), per block vs whole
#   bash benchmarks/gpu_proof.sh pure1     # issue 14: bf16-pure vs bf16 (GPT-2 vs plain compile, Llama-3.2-1B)
#   bash benchmarks/gpu_proof.sh auto1     # issue 14: defaults (compile auto) on TinyGPT and the seeds' QLoRA
#   bash benchmarks/gpu_proof.sh meta4     # issue 15: Llama-3-70B LoRA FSDP2 built on meta (4 GPUs), Llama-3-8B
#   bash benchmarks/gpu_proof.sh gpt2cal   # the planner's GPT-2 constants, re-measured with the loss padded (2 GPUs)
#   bash benchmarks/gpu_proof.sh qshard    # issue 15: QLoRA sharded: Llama-3-8B under fsdp/ddp/zero3, Llama-3-70B FSDP2
#   bash benchmarks/gpu_proof.sh float8    # issue 15: Llama-3-8B full FSDP2, bf16 vs float8 tensorwise/rowwise
#   bash benchmarks/gpu_proof.sh frontier8b  # issue 15: the same without full checkpointing (the planner says it fits)
#   bash benchmarks/gpu_proof.sh x4        # issue 15 on 4 GPUs: 70B QLoRA and LoRA FSDP2, 8B float8 and bf16 b4
#   bash benchmarks/gpu_proof.sh plainddp  # issue 15: TinyGPT DDP and ZeRO-2 vs the plain scripts, 1 and NPROC GPUs
#   bash benchmarks/gpu_proof.sh fsdp8b    # issue 15: Llama-3-8B FSDP2 vs the plain script (NPROC GPUs); ZeRO-3 70B LoRA
#   bash benchmarks/gpu_proof.sh lora7b    # issue 14: Mistral-7B bf16 LoRA vs HF Trainer + PEFT (GPU 0)
#   bash benchmarks/gpu_proof.sh fsdp8bprof  # issue 15: the same two sides without checkpointing, profiled (rank 0)
#   bash benchmarks/gpu_proof.sh offload   # issue 15: Llama-3-8B full ZeRO-3 on one GPU, the optimizer on the host
#   bash benchmarks/gpu_proof.sh gputests  # the tests that also run on a GPU (skipped on the CPU), on GPU 0
#   bash benchmarks/gpu_proof.sh fsdpvs    # issue 15: Llama-3-8B FSDP2 vs the plain script, with and without ckpt
#   bash benchmarks/gpu_proof.sh x4vs      # issue 15: Llama-3-8B FSDP2 vs plain on 4 GPUs, both orders (x4ckpt: with ckpt, DDP)
#   bash benchmarks/gpu_proof.sh hsdp      # issue 15: Llama-3-8B full, HSDP (2 groups of 2 GPUs) on 4 GPUs
#   bash benchmarks/gpu_proof.sh ddppure   # issue 15: TinyGPT DDP scaling 1 -> 4, bf16 autocast and bf16-pure
#   bash benchmarks/gpu_proof.sh fsdptrace # issue 15: Llama-3-8B FSDP2 + per-block checkpointing vs the plain script,
#                                          #   ours with the checkpoint traced (default) and around the block (NPROC: 2)
#   bash benchmarks/gpu_proof.sh ddpprof   # issue 15: TinyGPT DDP 1 -> NPROC (2) GPUs, our step and the plain one
#                                          #   profiled on rank 0 (compute, NCCL, idle), then ours with NCCL_ENVS
#   bash benchmarks/gpu_proof.sh ddpbuckets  # issue 15: our TinyGPT DDP step (whole model) at 1 and NPROC (4) GPUs, per
#                                          #   DDP bucket size of BUCKETS (25 100 250 MB)
#   bash benchmarks/gpu_proof.sh ddpprobe  # issue 15: our DDP step's phases by CUDA events at 1 and NPROC (2) GPUs,
#                                          #   per SCOPES (blocks model) and VARIANTS (base,no-sync; also no-mean, bf16),
#                                          #   5 steps traced; BUCKET_MB; then SIDES of vs_plain_ddp.py at 1 and NPROC
#   bash benchmarks/gpu_proof.sh packed7b  # issue 14: QLoRA with the packed 8-bit step vs HF; GPT-2 vs plain compile
#   bash benchmarks/gpu_proof.sh nf4fused  # issue 14: QLoRA with the 4-bit dequantization fused in compiled blocks
#   bash benchmarks/gpu_proof.sh nf4runs   # issue 14: the same, tunebench alone (memory free and checkpointed)
#   bash benchmarks/gpu_proof.sh kernels1  # issue 14: eager vs compiled vs Liger kernels; GPU tests; QLoRA fused
#                                          #   without checkpointing; Unsloth's side alone (.whl/unsloth-site.tgz)
#   bash benchmarks/gpu_proof.sh unsloth7b # issue 14: Mistral-7B QLoRA (METHOD=lora: bf16) vs HF and Unsloth
#   bash benchmarks/gpu_proof.sh loss1     # issue 14: the GPU tests; the loss's kernels against HF's and Liger's
#   bash benchmarks/gpu_proof.sh loss2     # issue 14: the compiled softmax's memory where the loss is the peak; Unsloth's
#                                          #   QLoRA side alone (its training peak apart from its load)
#   bash benchmarks/gpu_proof.sh offload1  # issue 14: activation offload: its tests on the GPU; Mistral-7B QLoRA vs HF
#                                          #   checkpointed with and without it (METHOD=lora: bf16)
#   bash benchmarks/gpu_proof.sh siblings  # issue 14: LoRA siblings (q/k/v, gate/up) as one vs apart: 4 layers, then
#                                          #   Mistral-7B vs HF (METHOD=qlora, OURS=..., LAYERS=0 skips the layers)
#   bash benchmarks/gpu_proof.sh dequant   # issue 14: the 4-bit dequantization three ways (Mistral-7B shapes); GPU tests
#   bash benchmarks/gpu_proof.sh dequant7b # issue 14: Mistral-7B QLoRA vs HF, dequantized by the kernel and as before
#                                          #   (OURS=..., variants with /ops: TUNEBENCH_NF4_KERNEL=0; NAME=, PROFILE=)
#   bash benchmarks/gpu_proof.sh attnk     # SDPA's backends timed on Mistral-7B's and GPT-2's attention shapes
#   bash benchmarks/gpu_proof.sh attngpt   # cuDNN's SDPA first: its GPU tests, GPT-2 vs plain compile with it and without
#                                          #   (Mistral-7B: OURS=none/cudnn,none bash benchmarks/gpu_proof.sh dequant7b)
#   bash benchmarks/gpu_proof.sh x2off     # 2 GPUs: activation offload under DDP (Llama-3.2-1B LoRA, with and without);
#                                          #   Llama-3-8B FSDP2 without checkpointing vs the plain script (the compiled loss)
#   bash benchmarks/gpu_proof.sh keep7b    # issue 14: Mistral-7B LoRA (GPU 0) and QLoRA (GPU 1) vs HF, checkpointing
#                                          #   three ways (ckpt_keep matmuls), the checkpointed one profiled
#   bash benchmarks/gpu_proof.sh scope     # eager, per block and whole model train alike (losses step by step), the
#                                          #   fused loss traced in a graph, the whole-model test on CUDA
#   bash benchmarks/gpu_proof.sh autoscope # issue 14: compile_scope auto = model for full fine-tuning (GPT-2, Llama-3.2-1B
#                                          #   against blocks), dropout 0, float8 frozen-base matmuls probed
#   bash benchmarks/gpu_proof.sh f8traced  # issue 14: a frozen float8 base checkpointed traced vs around, Mistral-7B vs HF
#                                          #   (METHOD=qlora|lora, OURS=..., TESTS=0 skips the float8 and 4-bit tests)
#   bash benchmarks/gpu_proof.sh f8runs    # issue 14: the same float8 configurations as `tunebench run` records, each
#                                          #   with the planner's prediction printed before it (records for test_plan)
#   bash benchmarks/gpu_proof.sh scopefit  # compile per block and whole model, same job, each shape of SHAPES (records
#                                          #   the planner's whole-model constants are fitted on); LOGLINE=1 first runs
#                                          #   a train job stopped and resumed, its log lines as the GPU's lag shows them
#   bash benchmarks/gpu_proof.sh host1     # tunebench hw's host dispatch (3 times), then GPT-2 small s512 b16 per block
#                                          #   and whole (host-bound per block): the planner's host scale checked
#   bash benchmarks/gpu_proof.sh runs      # each line of RUNS as one `tunebench run` (20 steps after 8, tag TAG): the
#                                          #   planner's out-of-sample check (its figures against tests/test_plan.py's);
#                                          #   GPUS (default 0) for runs of several processes
#   bash benchmarks/gpu_proof.sh scopeprof # GPU time by kind of kernel, per block and whole model, each shape of SHAPES
#   bash benchmarks/gpu_proof.sh launch1   # every strategy under torchrun on GPU 0 (the parent without the engine, the
#                                          #   ranks' fast exit), each command's wall time; a train job under FSDP2
#   bash benchmarks/gpu_proof.sh peaklive  # memory by phase and what is alive at the step's peak, each line of PROBES
#                                          #   (memory_probe.py key=value configurations; default: GPT-2 and
#                                          #   Llama-3.2-1B, whole model against per block)
#   bash benchmarks/gpu_proof.sh tracedsum # the loss's GPU tests, its memory check against the head's gradient summed, then
#                                          #   vs_traced_loss.py (SHAPES; SIDES: ours,ours-sum; ours-inplace; TESTS=0)
#   bash benchmarks/gpu_proof.sh hostgraph # tunebench hw's host figure (3 times), then host-bound GPT-2 small runs, whole
#                                          #   model and per block (RUNS, TAG): the host's figure against the steps
#   bash benchmarks/gpu_proof.sh hostprof  # SHAPES' steps: the host's side (cProfile, CUDA events), then kernels by kind
#   bash benchmarks/gpu_proof.sh cgraphs   # the whole graph replayed as CUDA graphs: its GPU tests (the accumulation
#                                          #   test broken on purpose must fail; BROKEN=0 skips), a train job with and
#                                          #   without them (TRAINS: each job's flags joined by commas; none: no job)
#   bash benchmarks/gpu_proof.sh packed    # packed rows' attention: its GPU tests, the ways timed (packed_attention.py;
#                                          #   ATTN=0 skips), train jobs of MODEL (GPT-2 small; SEQ, BATCH, STEPS) on
#                                          #   the standard library (JOBS: name:flags, "mask*" with varlen off)
#   bash benchmarks/gpu_proof.sh fp32      # fp32 on a GPU: the attention and tf32 tests (grouped keys repeated for the
#                                          #   memory-efficient kernel; TESTS=0 skips), TRAIN=1: a train job exact and with
#                                          #   TF32 (TRAINS: each job's flags joined by commas), each of RUNS as
#                                          #   `tunebench run`, each of SHAPES profiled
#   bash benchmarks/gpu_proof.sh families  # issue 44: the families' GPU paths against their references (CHECKS; none:
#                                          #   skipped), then LoRA and QLoRA (METHODS) of each of MODELS against HF Trainer
#                                          #   + PEFT (TARGETS: LoRA targets; NOHF=1: tunebench alone, NOOURS=1: HF alone,
#                                          #   NOPREP=1: HF's QLoRA without peft's kbit preparation; HFATTN: the HF side's
#                                          #   attention; SEQ, BATCH, STEPS)
set -uo pipefail
OUT=${OUT:-/tmp/tunebench-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# the image sets PYTHONDONTWRITEBYTECODE and ships no bytecode: every process compiled torch and transformers from
# source (import tunebench.runner 18 s on the H100 machine). Bytecode cached aside is written once per machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
export TUNEBENCH_STORE=$OUT/results.db
tb() { python3 -m tunebench.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, peft, bitsandbytes; print(torch.__version__, transformers.__version__, peft.__version__, bitsandbytes.__version__)'

case "${1:-core}" in
core)
  tb run --model tinygpt-124m --method full --seq-len 2048 --batch-size 8 --steps 30 --warmup 10 --tag gpu-proof
  tb run --model tinygpt-124m --method full --seq-len 2048 --batch-size 8 --steps 30 --warmup 10 --compile --tag gpu-proof
  python3 benchmarks/vs_hf_trainer.py --model mistral-7b --seq-len 512 --batch-size 8 --steps 30 --warmup 10 \
    --liger --out "$OUT/vs_hf_trainer.json"
  ;;
single)
  export CUDA_VISIBLE_DEVICES=0
  for c in "" "--compile"; do
    tb run --model tinygpt-124m --method full --seq-len 2048 --batch-size 8 --steps 30 --warmup 10 \
      --optimizer adamw_fused $c --tag gpu-proof
  done
  python3 benchmarks/vs_hf_trainer.py --model mistral-7b --seq-len 512 --batch-size 8 --steps 30 --warmup 10 \
    --out "$OUT/vs_hf_trainer.json"
  ;;
scale8|scale1x4)
  shape="--batch-size 8 --grad-accum 1"
  [ "$1" = scale1x4 ] && shape="--batch-size 1 --grad-accum 4"
  for s in ddp fsdp zero2 zero3; do
    tb run --model tinygpt-124m --method full --seq-len 2048 $shape --steps 20 --warmup 8 \
      --optimizer adamw_fused --strategy $s --gpus 1,2,4 --tag "gpu-proof-$1" 2>&1 | grep -v "step [0-9]*/"
  done
  ;;
sweeps)
  tb sweep diagnostic --run-timeout 600
  tb quick
  ;;
consistency)
  tb consistency --model mistral-7b --method qlora --seq-len 512 --batch-size 8 --grad-ckpt \
    --optimizer paged_adamw_8bit --lora-rank 16 --lora-alpha 32 --steps 20 --warmup 8
  ;;
hw1)
  export CUDA_VISIBLE_DEVICES=0
  tb hw --tag gpu-proof
  tb load --model mistral-7b --precisions bf16,fp16,int8,nf4 --tag gpu-proof
  tb load --model mistral-7b --precisions bf16,nf4 --cache cold --tag gpu-proof
  tb report --out "$OUT/report"
  ;;
infer)
  export CUDA_VISIBLE_DEVICES=0
  tb infer --model mistral-7b --precisions bf16,nf4 --batch-sizes 1,8,32,64 --repeats 2 --tag gpu-proof
  tb infer --model mistral-7b --precisions bf16 --batch-sizes 1,8,32 --kv-cache static --compile --tag gpu-proof
  python3 benchmarks/vs_hf_generate.py --model mistral-7b --precisions bf16 --batch-sizes 1,8,32 --repeats 2 \
    --out "$OUT/vs_hf_generate.json"
  tb report --out "$OUT/report"
  ;;
hw4)
  tb hw --sections collectives --tag gpu-proof
  tb hw --quick --tag gpu-proof
  tb report --out "$OUT/report"
  ;;
telemetry)
  python3 benchmarks/telemetry_overhead.py --pairs 3
  tb run --model tinygpt-124m --method full --seq-len 2048 --batch-size 8 --steps 30 --warmup 10 \
    --optimizer adamw_fused --tag gpu-proof-telemetry
  ;;
train1)
  export CUDA_VISIBLE_DEVICES=0 TUNEBENCH_CACHE=/tmp/tbcache
  python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000
  mkdir -p "$OUT/tokenizer" && cp /tmp/corpus/tokenizer/* "$OUT/tokenizer/"
  C="--tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --tag train-proof"
  tb train --model tinygpt-124m $C --seq-len 1024 --batch-size 16 --max-steps 400 --lr 1e-3 --warmup-steps 40 \
    --optimizer adamw_fused --eval-fraction 0.02 --eval-every 100 --eval-batches 20 --log-every 100 \
    --output-dir /tmp/scratch --target-eval-loss 5.5
  # the benchmark predicts the job: the same QLoRA workload as `run` (synthetic) and `train` (the corpus),
  # alternated twice, 60 steps of which 15 untimed
  Q="--model mistral-7b --method qlora --seq-len 512 --batch-size 8 --grad-ckpt --optimizer paged_adamw_8bit"
  Q="$Q --lora-rank 16 --lora-alpha 32"
  for i in 1 2; do
    tb run $Q --steps 60 --warmup 15 --tag train-proof 2>&1 | grep "tokens/s  \|step time"
    tb train $Q $C --max-steps 60 --warmup 15 --no-packing --log-every 60 --output-dir /tmp/q-unpacked-$i \
      2>&1 | grep "^train:\|tokens/s  \|step time"
  done
  tb train $Q $C --max-steps 60 --warmup 15 --log-every 60 --output-dir /tmp/q-packed 2>&1 | grep "^train:\|tokens/s  "
  ;;
train2)
  export TUNEBENCH_CACHE=/tmp/tbcache
  # the tokenizer train1 made, when it was carried along (.gpu/tokenizer): the same token ids, no retraining
  [ -f .gpu/tokenizer/tokenizer.json ] && mkdir -p /tmp/corpus && cp -r .gpu/tokenizer /tmp/corpus/
  python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000
  F="--model llama-3.2-1b --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --strategy fsdp"
  F="$F --nproc-per-node 2 --seq-len 1024 --batch-size 8 --max-steps 60 --save-every 20 --log-every 5"
  F="$F --eval-fraction 0.02 --eval-every 30 --eval-batches 10 --output-dir /tmp/fsdp --tag train-proof"
  rm -rf /tmp/fsdp  # a warm machine keeps the last call's files
  python3 -m tunebench.cli train $F > "$OUT/fsdp-first.log" 2>&1 &  # not `tb &`: $! must be tunebench itself
  job=$!
  until grep -q "train: step 3[0-9]/60" "$OUT/fsdp-first.log" || ! kill -0 $job 2>/dev/null; do sleep 1; done
  kill -TERM $job; wait $job; echo "first part exited with code $? (75: stopped by the signal, checkpoint saved)"
  grep "^train:\|^eval:\|^checkpoint:" "$OUT/fsdp-first.log" | tail -8
  ls /tmp/fsdp/checkpoints
  tb train $F --resume latest 2>&1 | grep -v "Writing\|Loading"
  ;;
probe)
  # issue 16: the planner's ground truth, phase by phase, on GPU 0
  export CUDA_VISIBLE_DEVICES=0
  T="model=tinygpt-124m batch_size=8 seq_len=2048 optimizer=adamw_fused"
  L="model=llama-3.2-1b seq_len=1024"
  M="model=mistral-7b method=qlora seq_len=1024 optimizer=paged_adamw_8bit"
  python3 benchmarks/memory_probe.py --out "$OUT/probe.jsonl" "$T" "$T compile=true" "$T strategy=fsdp" \
    "$T strategy=zero2" "$T strategy=zero3" "$T strategy=ddp" \
    "model=tinygpt-124m batch_size=1 grad_accum=4 seq_len=2048 optimizer=adamw_fused strategy=ddp" \
    "$L batch_size=4" "$L batch_size=8 strategy=fsdp" "$L batch_size=8 strategy=fsdp grad_ckpt=true" \
    "$L batch_size=8 strategy=fsdp compile=true" "$L batch_size=8 method=lora" "$L batch_size=8 strategy=zero2" \
    "$M batch_size=4 grad_ckpt=true" "$M batch_size=2" "model=mistral-7b method=lora seq_len=1024 batch_size=4 grad_ckpt=true" \
    2>&1 | grep -v "^\[" | cut -c 1-400
  ;;
tune1)
  # issue 16: FSDP2 + checkpointing on one GPU (the recompute cast), the plan, then the seeds' journey tuned
  export CUDA_VISIBLE_DEVICES=0
  tb run --model llama-3.2-1b --strategy fsdp --nproc-per-node 1 --grad-ckpt --seq-len 1024 --batch-size 8 \
    --steps 6 --warmup 2 --tag gpu-proof-fsdp-ckpt 2>&1 | grep -v "step [0-9]*/"
  Q="--model mistral-7b --method qlora --seq-len 1024 --batch-size 4 --grad-ckpt --optimizer paged_adamw_8bit"
  tb plan $Q
  tb tune $Q --seq-lens 512,1024 --max-runs 10 --max-minutes 6 --out "$OUT/tune-mistral" --json \
    > "$OUT/tune-mistral.json"
  ;;
tune4)
  # issue 16: the strategy choice on 4 GPUs, global batch 16 held (the seeds' batch 1 x accumulation 4 per GPU)
  tb tune --model tinygpt-124m --strategy ddp --nproc-per-node 4 --batch-size 1 --grad-accum 4 --seq-len 2048 \
    --optimizer adamw_fused --gpus 4 --global-batch 16 --max-runs 10 --max-minutes 5 --out "$OUT/tune-tinygpt" \
    --json > "$OUT/tune-tinygpt.json"
  ;;
autoscope)
  export CUDA_VISIBLE_DEVICES=0
  python3 benchmarks/kernels_vs.py --ops base_fp8 --reps 30 --out "$OUT/base_fp8.json" 2>&1 | grep -v Warn | tail -3
  gpt="--model tinygpt-124m --seq-len 2048 --batch-size 8 --steps 30 --warmup 10 --tag autoscope"
  llama="--model llama-3.2-1b --seq-len 2048 --batch-size 2 --steps 20 --warmup 8 --tag autoscope"
  for args in "$gpt" "$gpt --dropout 0 --precision bf16-pure" "$llama" "$llama --compile-scope blocks"; do
    tb run $args 2>&1 | grep -v "step [0-9]*/" | tail -3
  done
  tb results export --format jsonl -o "$OUT/results.jsonl"
  ;;
plaingpt)
  # issue 14: each side its own process, one after the other; where the GPU time goes with --profile
  export CUDA_VISIBLE_DEVICES=0
  python3 benchmarks/vs_plain_gpt.py --profile --out "$OUT/vs_plain_gpt.json" ${SIDES:+--sides $SIDES}
  ;;
scope7b)
  export CUDA_VISIBLE_DEVICES=0
  for scope in blocks model; do
    tb run --model mistral-7b --method qlora --seq-len 512 --batch-size 8 --grad-ckpt --optimizer paged_adamw_8bit \
      --steps 30 --warmup 10 --compile --compile-scope $scope --tag gpu-proof-scope 2>&1 | grep -v "step [0-9]*/"
  done
  ;;
plancheck)
  # each record stores the planner's prediction (made from the spec sheet: this store has no hw record)
  export CUDA_VISIBLE_DEVICES=0
  common="--steps 20 --warmup 8 --tag plancheck"
  tb run --model llama-3.2-1b --method lora --seq-len 1024 --batch-size 8 --optimizer adamw_fused $common
  tb run --model llama-3.2-1b --method full --seq-len 2048 --batch-size 4 --grad-ckpt --optimizer adamw_fused $common
  tb run --model tinygpt-124m --method full --seq-len 1024 --batch-size 16 --compile --optimizer adamw_fused $common
  tb run --model mistral-7b --method qlora --seq-len 1024 --batch-size 4 --grad-ckpt --optimizer paged_adamw_8bit \
    --lora-rank 16 --lora-alpha 32 $common
  ;;
hw100)
  export CUDA_VISIBLE_DEVICES=0
  tb hw --sections ${SECTIONS:-matmul,bandwidth} --dtypes ${DTYPES:-bf16} ${HWFLAGS:-} --tag gpu-proof-hw
  ;;
attn1)
  export CUDA_VISIBLE_DEVICES=0
  tb infer --model mistral-7b --precisions bf16 --batch-sizes 1,8 --kv-cache static --compile --tag gpu-proof-attn
  for s in fsdp zero2; do
    tb run --model llama-3.2-1b --method full --strategy $s --nproc-per-node 1 --seq-len 1024 --batch-size 4 \
      --steps 12 --warmup 4 --optimizer adamw_fused --tag gpu-proof-attn 2>&1 | grep -v "step [0-9]*/"
  done
  ;;
free7b)
  export CUDA_VISIBLE_DEVICES=0
  for batch in ${BATCHES:-8 16}; do
    for scope in ${SCOPES:-blocks model}; do
      tb run --model mistral-7b --method qlora --seq-len 512 --batch-size $batch --no-grad-ckpt --optimizer adamw_fused \
        --steps 30 --warmup 10 --compile --compile-scope $scope --tag gpu-proof-free7b 2>&1 | grep -v "step [0-9]*/"
    done
  done
  ;;
pure1)
  export CUDA_VISIBLE_DEVICES=0
  python3 benchmarks/vs_plain_gpt.py --sides ${SIDES:-plain-compile,ours-model,ours-model-pure,ours-blocks,ours-blocks-pure} \
    --out "$OUT/vs_plain_gpt_pure.json"
  for precision in bf16 bf16-pure; do
    tb run --model llama-3.2-1b --method full --seq-len 2048 --batch-size 4 --grad-ckpt --optimizer adamw_fused \
      --precision $precision --steps 25 --warmup 10 --tag gpu-proof-pure 2>&1 | grep -v "step [0-9]*/"
  done
  ;;
auto1)
  # nothing said about compile: auto turns it on for GPU training; compile_s is reported apart
  export CUDA_VISIBLE_DEVICES=0
  tb run --model tinygpt-124m --seq-len 2048 --batch-size 8 --optimizer adamw_fused --steps 30 --warmup 10 \
    --tag gpu-proof-auto 2>&1 | grep -v "step [0-9]*/"
  tb run --model mistral-7b --method qlora --seq-len 512 --batch-size 8 --grad-ckpt --optimizer paged_adamw_8bit \
    --steps 30 --warmup 10 --tag gpu-proof-auto 2>&1 | grep -v "step [0-9]*/"
  ;;
meta4)
  # 70.6 B parameters (141 GB in bf16, more than one GPU holds whole with room to train): built on meta, each
  # rank makes its own shard; nvidia-smi while it builds shows no GPU ever holding the whole model
  ( for i in $(seq 1 120); do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits \
      | tr '\n' ' '; echo; sleep 2; done ) > "$OUT/meta4-nvidia-smi.txt" 2>&1 &
  SMI=$!
  tb run --model llama-3-70b --method lora --strategy fsdp --nproc-per-node 4 --seq-len 2048 --batch-size ${BATCH:-4} \
    --grad-ckpt --optimizer adamw_fused --steps 10 --warmup 4 --run-timeout 420 --tag gpu-proof-meta4 \
    2>&1 | grep -v "step [0-9]*/"
  kill $SMI 2>/dev/null
  [ -n "${WITH8B:-}" ] && tb run --model llama-3-8b --method full --strategy fsdp --nproc-per-node 4 --seq-len 4096 \
    --batch-size 2 --grad-ckpt --steps 12 --warmup 4 --optimizer adamw_fused --tag gpu-proof-meta4 2>&1 \
    | grep -v "step [0-9]*/"
  ;;
qshard)
  # QLoRA with its 4-bit base sharded (packed into bf16): the same job under each strategy on 2 GPUs, then the
  # 70B base (35 GB in 4 bits) built on meta and split over 2 GPUs; nvidia-smi every 2 s while it runs
  Q="--method qlora --seq-len 2048 --batch-size 4 --grad-ckpt --tag gpu-proof-qshard"
  show() { grep -E "status|tokens/s  |peak memory|setup|loss first|Error|error" ; }
  tb run --model llama-3-8b $Q --strategy fsdp --nproc-per-node 2 --steps 10 --warmup 4 --run-timeout 200 2>&1 \
    | show | tee "$OUT/qshard-8b.txt"
  NC=""; grep -q "status: ok" "$OUT/qshard-8b.txt" || NC="--no-compile"  # the 70B run must not fail on compile
  ( for i in $(seq 1 150); do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits \
      | tr '\n' ' '; echo; sleep 2; done ) > "$OUT/qshard-nvidia-smi.txt" 2>&1 &
  SMI=$!
  tb run --model llama-3-70b $Q --strategy fsdp --nproc-per-node 2 --steps 7 --warmup 3 --run-timeout 290 $NC 2>&1 \
    | show
  kill $SMI 2>/dev/null
  for s in ddp zero3; do
    tb run --model llama-3-8b $Q --strategy $s --nproc-per-node 2 --steps 10 --warmup 4 --run-timeout 100 2>&1 | show
  done
  ;;
float8)
  # Llama-3-8B full fine-tune on 2 GPUs, FSDP2 + per-block checkpointing, the issue's shape; the same seed and data
  # in each, so the loss curves compare (bf16 against float8 tensorwise and rowwise)
  python3 -c 'import torch, torchao; print("torchao", torchao.__version__)' 2>&1 | grep -v Enum | tail -1
  F="--model llama-3-8b --method full --strategy fsdp --nproc-per-node 2 --seq-len 4096 --batch-size 2 --grad-ckpt"
  F="$F --optimizer adamw_fused --steps 12 --warmup 4 --run-timeout 170 --tag gpu-proof-float8"
  for r in off tensorwise rowwise; do
    tb run $F --float8 $r 2>&1 | grep -E "status|tokens/s  |peak memory|MFU|setup|loss first|Error|error"
  done
  tb run --model llama-3-8b --method qlora --seq-len 2048 --batch-size 4 --grad-ckpt --tag gpu-proof-qshard \
    --strategy zero2 --nproc-per-node 2 --steps 10 --warmup 4 --run-timeout 100 2>&1 \
    | grep -E "status|tokens/s  |peak memory|setup|loss first|Error|error"
  ;;
frontier8b)
  # Llama-3-8B full FSDP2 on 2 GPUs, s4096 b2: no checkpointing (83.9 GiB predicted of 141), one block in two
  # checkpointed, and float8 tensorwise without checkpointing
  F="--model llama-3-8b --method full --strategy fsdp --nproc-per-node 2 --seq-len 4096 --batch-size 2"
  F="$F --optimizer adamw_fused --steps 12 --warmup 4 --run-timeout 170 --tag gpu-proof-frontier8b"
  cases=("" "--grad-ckpt --ckpt-every 2" "--float8 tensorwise")
  # B3=1: batch 3 (99.6 GiB predicted), bf16 and float8, the allocator told to grow segments rather than split them
  [ -n "${B3:-}" ] && { cases=("--batch-size 3" "--batch-size 3 --float8 tensorwise");
                        export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; }
  for extra in "${cases[@]}"; do
    tb run $F $extra 2>&1 | grep -E "status|tokens/s  |peak memory|MFU|setup|loss first|Error|error"
  done
  ;;
x4)
  # the issue's 4-GPU proofs, most wanted first (a short device budget may cut the tail)
  show() { grep -E "status|tokens/s  |peak memory|MFU|setup|Error|error" ; }
  L="--model llama-3-70b --strategy fsdp --nproc-per-node 4 --seq-len 2048 --batch-size 4 --grad-ckpt --steps 6"
  L="$L --warmup 2 --run-timeout 150 --tag gpu-proof-x4"
  E="--model llama-3-8b --method full --strategy fsdp --nproc-per-node 4 --seq-len 4096 --batch-size 4"
  E="$E --optimizer adamw_fused --steps 10 --warmup 4 --run-timeout 110 --tag gpu-proof-x4"
  tb run $L --method qlora 2>&1 | show
  tb run $E --float8 tensorwise 2>&1 | show
  tb run $L --method lora --optimizer adamw_fused 2>&1 | show
  tb run $E 2>&1 | show
  ;;
fsdp8b)
  show() { grep -E "status|tokens/s  |peak memory|MFU|setup|Error|error" ; }
  python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-4} --sides plain-ckpt,ours-ckpt,plain,ours --batch-size 2 \
    --steps 12 --warmup 5 --side-timeout 150 --out "$OUT/vs_plain_fsdp.json" 2>&1 | tail -7
  # ZeRO-3 built partitioned (zero.Init): a bf16 70B base of 131 GiB, 33 GiB on each of 4 GPUs
  tb run --model llama-3-70b --method lora --strategy zero3 --nproc-per-node ${NPROC:-4} --seq-len 2048 \
    --batch-size 2 --grad-ckpt --optimizer adamw_fused --steps 5 --warmup 2 --run-timeout 200 \
    --tag gpu-proof-zero3 2>&1 | show
  ;;
fsdp8bprof)
  python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-4} --sides plain,ours --batch-size 2 --steps 10 --warmup 4 \
    --profile 5 --side-timeout 200 --out "$OUT/vs_plain_fsdp_profile.json" 2>&1 | tail -32
  ;;
offload)
  show() { grep -E "status|tokens/s  |peak memory|MFU|setup|Error|error" ; }
  # 8B x 16 bytes of model states do not fit one GPU; offloaded, the GPU keeps the bf16 weights and gradients
  tb plan --model llama-3-8b --method full --strategy zero3 --nproc-per-node 1 --seq-len 4096 --batch-size 2 \
    --grad-ckpt --offload optimizer --gpu h200 2>&1 | head -12
  tb run --model llama-3-8b --method full --strategy zero3 --nproc-per-node 1 --seq-len 4096 --batch-size 2 \
    --grad-ckpt --offload optimizer --steps 6 --warmup 2 --run-timeout 300 --tag gpu-proof-offload 2>&1 | show
  ;;
kernels1)
  bash "$0" gputests
  python3 benchmarks/kernels_vs.py --out "$OUT/kernels_vs.json" 2>&1 | grep -E "fwd\+bwd|device|rror"
  Q="--model mistral-7b --method qlora --seq-len 512 --batch-size 8 --optimizer paged_adamw_8bit --steps 24 --warmup 8"
  tb run $Q --no-grad-ckpt --tag gpu-proof-nf4free 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  bash "$0" unslothsite
  PYTHONPATH=/tmp/usite:$PYTHONPATH python3 benchmarks/vs_hf_trainer.py --side unsloth --variant ckpt --profile "" --model mistral-7b --seq-len 512 \
    --batch-size 8 --steps 24 --warmup 8 --method qlora --grad-ckpt > "$OUT/unsloth1.txt" 2>&1
  grep RESULT "$OUT/unsloth1.txt" || tail -c 3000 "$OUT/unsloth1.txt"
  ;;
loss1)
  bash "$0" gputests
  python3 benchmarks/kernels_vs.py --ops loss --out "$OUT/kernels_vs_loss.json" 2>&1 | grep -E "fwd\+bwd|device|rror"
  ;;
loss2)
  Q="--model mistral-7b --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --no-grad-ckpt --tag gpu-proof-loss2"
  tb run $Q --method qlora --optimizer paged_adamw_8bit 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  tb run $Q --method lora --optimizer adamw_fused 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  tb run --model llama-3.2-1b --method full --seq-len 2048 --batch-size 4 --steps 20 --warmup 8 --optimizer adamw_fused \
    --tag gpu-proof-loss2 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  bash "$0" unslothsite
  PYTHONPATH=/tmp/usite:$PYTHONPATH python3 benchmarks/vs_hf_trainer.py --side unsloth --variant ckpt --profile "" \
    --model mistral-7b --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --method qlora --grad-ckpt \
    > "$OUT/unsloth_qlora.txt" 2>&1
  grep RESULT "$OUT/unsloth_qlora.txt" | cut -c1-300 || tail -c 2000 "$OUT/unsloth_qlora.txt"
  ;;
offload1)
  CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/test_offload.py 2>&1 | tail -2
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method ${METHOD:-qlora} --model mistral-7b \
    --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-ckpt,ckpt+off,ckpt+mm+off} \
    --out "$OUT/offload1_${METHOD:-qlora}.json" 2>&1 | tail -n 9
  ;;
siblings)  # issue 14: LoRA siblings as one vs apart: 4 Mistral layers compiled, then Mistral-7B vs HF (GPU 0)
  [ "${LAYERS:-1}" = 1 ] && python3 benchmarks/kernels_vs.py --ops layers --out "$OUT/kernels_layers.json" 2>&1 | tail -2
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method ${METHOD:-lora} --model mistral-7b \
    --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-none,none/apart,ckpt,ckpt/apart} \
    --out "$OUT/siblings_${METHOD:-lora}.json" 2>&1 | tail -n 9
  ;;
x2off)
  D="--model llama-3.2-1b --method lora --strategy ddp --nproc-per-node 2 --seq-len 2048 --batch-size 8 --grad-ckpt"
  D="$D --steps 16 --warmup 6 --tag gpu-proof-x2off"
  tb run $D 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  tb run $D --offload activations 2>&1 | grep -E "status|tokens/s  |peak memory|rror"
  python3 benchmarks/vs_plain_fsdp.py --gpus 2 --sides plain,ours --batch-size 2 --steps 16 --warmup 5 \
    --side-timeout 170 --out "$OUT/vs_plain_fsdp_x2.json" 2>&1 | tail -5
  ;;
unslothsite)  # Unsloth's packages (unsloth, unsloth_zoo and what the image lacks; its web studio left out)
  mkdir -p /tmp/usite && tar xzf .whl/unsloth-site.tgz -C /tmp/usite
  ;;
unsloth7b)
  bash "$0" unslothsite
  PYTHONPATH=/tmp/usite:$PYTHONPATH python3 -c "import unsloth; from unsloth import FastLanguageModel" \
    > "$OUT/unsloth_import.txt" 2>&1 || { tail -c 3000 "$OUT/unsloth_import.txt"; exit 1; }
  UNSLOTH_SITE=/tmp/usite python3 benchmarks/vs_hf_trainer.py --method ${METHOD:-qlora} --model mistral-7b \
    --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-ckpt+mm,none} --unsloth \
    --out "$OUT/unsloth7b_${METHOD:-qlora}.json" 2>&1 | tail -n 12
  ;;
dequant)
  # 4-bit dequantization: bitsandbytes vs inductor's kernel for the torch ops vs our Triton kernel; the GPU tests
  python3 benchmarks/dequant_vs.py --out "$OUT/dequant_vs.json" 2>&1 | tail -n 46
  [ "${TESTS:-1}" = 1 ] && bash "$0" gputests
  ;;
dequant7b)  # issue 14: Mistral-7B QLoRA vs HF, 4-bit dequantization by our Triton kernel and as before (/ops)
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method qlora --model mistral-7b --seq-len 512 \
    --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-ckpt,ckpt/ops,none,none/ops} --profile "${PROFILE:-}" \
    --out "$OUT/dequant7b_${NAME:-a}.json" 2>&1 | tail -n ${TAIL:-12}
  ;;
f8traced)
  [ "${TESTS:-1}" = 1 ] && python3 -m pytest -q -p no:cacheprovider tests/test_float8_frozen.py tests/test_nf4.py \
    tests/test_recompute.py::test_traced_blocks_keep_only_their_input 2>&1 | tail -3
  python3 benchmarks/vs_hf_trainer.py --method ${METHOD:-qlora} --model mistral-7b --seq-len 512 --batch-size 8 \
    --steps 24 --warmup 8 --ours ${OURS:-ckpt/f8,ckpt/f8/around} --profile "${PROFILE:-}" \
    --out "$OUT/f8traced_${METHOD:-qlora}${NAME:-}.json" 2>&1 | tail -n ${TAIL:-12}
  ;;
cgraphs)
  # CUDA graphs for the whole graph: its GPU tests, then the accumulation test with gradients taken from the graph's
  # memory (grads_kept off: it must fail), then a train job from scratch with and without them (BROKEN=0 skips)
  export CUDA_VISIBLE_DEVICES=0 TUNEBENCH_CACHE=/tmp/tbcache
  python3 -m pytest -q -rf -p no:cacheprovider tests/test_compile.py -k "cuda_graphs or kept or whole_model_compile" \
    2>&1 | grep -E "^FAILED|^E  |passed|failed" | head -20
  if [ "${BROKEN:-1}" = 1 ]; then
    sed -i 's/grads_kept=kept)/grads_kept=False)/' src/tunebench/strategies/single.py
    python3 -m pytest -q -p no:cacheprovider tests/test_compile.py -k "cuda_graphs_train" 2>&1 \
      | grep -E "^E .*(assert|Expected|Obtained)|passed|failed" | head -6
    sed -i 's/grads_kept=False)/grads_kept=kept)/' src/tunebench/strategies/single.py
  fi
  [ "${TRAINS:-}" = none ] && exit 0
  python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000 > /dev/null
  C="--model tinygpt-124m --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --seq-len 1024"
  C="$C --batch-size 4 --grad-accum 2 --max-steps 120 --lr 1e-3 --warmup-steps 20 --eval-fraction 0.02"
  C="$C --eval-every 60 --eval-batches 10 --log-every 60 --tag cgraphs"
  for g in ${TRAINS:-"--cuda-graphs" "--no-cuda-graphs"}; do  # TRAINS: each one job's extra flags, one word each
    echo "== train ${g//,/ }"; tb train $C ${g//,/ } --output-dir "/tmp/cg$g" 2>&1 | grep -E "^train:|tokens/s  |rror"
  done
  tb results export --format jsonl -o "$OUT/cgraphs.jsonl" > /dev/null
  ;;
hostprof)  # each of SHAPES: the host's side of its step (profile_trace.py --host), then its kernels by kind
  export CUDA_VISIBLE_DEVICES=0
  while IFS= read -r shape; do
    [ -n "$shape" ] || continue
    echo "HOST $shape"
    timeout 200 python3 benchmarks/profile_trace.py --host $shape 2>&1 | grep -v "Warning\|^  \"\"\"" | head -${TOP:-40}
    timeout 200 python3 benchmarks/profile_trace.py $shape 2>&1 | tail -1
  done <<< "${SHAPES:---model tinygpt-124m --method full --seq-len 512 --batch-size 1}" | tee "$OUT/hostprof.txt"
  ;;
f8runs)
  export CUDA_VISIBLE_DEVICES=${GPUS:-0}
  C="--model mistral-7b --seq-len 512 --batch-size 8 --grad-ckpt --lora-rank 16 --lora-alpha 32 --lora-dropout 0
     --float8 rowwise --steps 24 --warmup 8 --tag f8runs"
  for v in "--method qlora --optimizer paged_adamw_8bit" \
           "--method qlora --optimizer paged_adamw_8bit --ckpt-keep matmuls --ckpt-keep-every 8" \
           "--method lora --optimizer adamw_fused"; do
    tb plan $C $v --gpu h200 2>&1 | grep -E "^│ (peak allocated|tokens/s) "
    tb run $C $v 2>&1 | grep -v "step [0-9]*/" | tail -4
  done
  tb results export --format jsonl -o "$OUT/f8runs.jsonl"
  ;;
attnk)  # SDPA's backends (flash, memory-efficient, cuDNN) on Mistral-7B's and GPT-2 small's shapes
  python3 benchmarks/kernels_vs.py --ops attention,attention_gpt2 --out "$OUT/kernels_attention.json" 2>&1 | tail -8
  ;;
attngpt)  # cuDNN's SDPA first vs flash's: its GPU tests; GPT-2 small whole model vs plain torch.compile (GPU 0)
  CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/test_attn_kernel.py 2>&1 | tail -3
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_plain_gpt.py --sides ${SIDES:-plain-compile,ours-model-cudnn,ours-model} \
    --out "$OUT/vs_plain_gpt_attn.json" 2>&1 | tail -n 8
  ;;
scope)
  CUDA_VISIBLE_DEVICES=${GPU:-0} python3 -m pytest -q -p no:cacheprovider tests/test_loss.py tests/test_compile.py 2>&1 | tail -2
  CUDA_VISIBLE_DEVICES=${GPU:-0} python3 benchmarks/scope_losses.py --steps 8 2>&1 | grep "^fp32\|^bf16" | tee "$OUT/scope_losses.txt"
  ;;
gputests)
  CUDA_VISIBLE_DEVICES=${GPU:-0} python3 -m pytest -q -p no:cacheprovider tests/test_loss.py tests/test_optim.py \
    tests/test_nf4.py tests/test_offload.py tests/test_lora_siblings.py tests/test_attn_kernel.py \
    tests/test_float8_frozen.py tests/test_compile.py tests/test_models.py \
    tests/test_recompute.py::test_traced_blocks_keep_only_their_input 2>&1 | tail -4
  ;;
nf4fused)
  # 4-bit dequantization fused in the compiled blocks: Mistral-7B QLoRA vs HF with checkpointing two ways (GPU 0),
  # memory free timed (GPU 1) and profiled with its trace (GPU 2), the GPU-only tests (GPU 3)
  Q="--model mistral-7b --method qlora --seq-len 512 --batch-size 8"
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py $Q --steps 24 --warmup 8 --ours ckpt,ckpt+mm \
    --profile ckpt+mm --out "$OUT/nf4_qlora.json" > "$OUT/nf4_qlora.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 -m tunebench.cli run $Q --no-grad-ckpt --optimizer paged_adamw_8bit --steps 24 \
    --warmup 8 --tag gpu-proof-nf4 > "$OUT/nf4_free.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=2 PROFILE_TRACE="$OUT/trace_nf4_free.json" python3 benchmarks/profile_trace.py $Q \
    --no-grad-ckpt --optimizer paged_adamw_8bit > "$OUT/nf4_free_profile.txt" 2>&1 &
  GPU=3 bash "$0" gputests > "$OUT/gputests.txt" 2>&1 &
  wait
  python3 benchmarks/profile_trace.py --gaps "$OUT/trace_nf4_free.json" | head -12; rm -f "$OUT/trace_nf4_free.json"
  tail -n 16 "$OUT/nf4_qlora.txt"; grep -E "status|tokens/s  |peak memory|rror" "$OUT/nf4_free.txt"
  tail -c 600 "$OUT/nf4_free_profile.txt"; echo; cat "$OUT/gputests.txt"
  ;;
nf4runs)
  # the fused 4-bit path alone (no HF side): memory free (GPU 0), checkpointed (GPU 1), the GPU-only tests (GPU 2)
  Q="--model mistral-7b --method qlora --seq-len 512 --batch-size 8 --optimizer paged_adamw_8bit --steps 24 --warmup 8"
  CUDA_VISIBLE_DEVICES=0 python3 -m tunebench.cli run $Q --no-grad-ckpt --tag gpu-proof-nf4 > "$OUT/nf4_free.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 -m tunebench.cli run $Q --grad-ckpt --tag gpu-proof-nf4 > "$OUT/nf4_ckpt.txt" 2>&1 &
  GPU=2 bash "$0" gputests > "$OUT/gputests.txt" 2>&1 &
  wait
  for f in nf4_free nf4_ckpt; do grep -E "status|tokens/s  |peak memory|rror" "$OUT/$f.txt"; done; cat "$OUT/gputests.txt"
  ;;
packed7b)
  # the packed 8-bit step: Mistral-7B QLoRA vs HF (GPU 0, checkpointing three ways, one profiled); GPT-2 against
  # plain torch.compile with the loss's grouped head gradient (GPU 1); the GPU-only tests (GPU 2)
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method qlora --model mistral-7b --seq-len 512 \
    --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-ckpt,ckpt+mm,none} --profile ${PROFILE:-ckpt+mm} \
    --out "$OUT/packed7b_qlora.json" > "$OUT/packed7b_qlora.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 benchmarks/vs_plain_gpt.py --sides plain-compile,ours-model,ours-model-pure \
    --out "$OUT/vs_plain_gpt_grouped.json" > "$OUT/vs_plain_gpt_grouped.txt" 2>&1 &
  GPU=2 bash "$0" gputests > "$OUT/gputests.txt" 2>&1 &
  wait
  tail -n 22 "$OUT/packed7b_qlora.txt"; tail -n 8 "$OUT/vs_plain_gpt_grouped.txt"; cat "$OUT/gputests.txt"
  ;;
fsdpvs)
  python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-4} --sides plain-ckpt,ours-ckpt,plain,ours --batch-size 2 \
    --steps 12 --warmup 5 --side-timeout 150 --out "$OUT/vs_plain_fsdp.json" 2>&1 | tail -7
  ;;
x4vs)  # issue 15: Llama-3-8B FSDP2 vs the plain script on 4 GPUs, no checkpointing, each order, 20 timed steps
  for order in plain,ours ours,plain; do
    python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-4} --sides $order --batch-size 2 --steps 25 --warmup 5 \
      --side-timeout 200 --out "$OUT/vs_plain_fsdp_${order/,/_}.json" 2>&1 | tail -4
  done
  ;;
x4ckpt)  # issue 15: the same with per-block checkpointing, then TinyGPT DDP 1 -> 4 GPUs against the plain script
  python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-4} --sides plain-ckpt,ours-ckpt --batch-size 2 --steps 20 \
    --warmup 5 --side-timeout 200 --out "$OUT/vs_plain_fsdp_ckpt.json" 2>&1 | tail -4
  python3 benchmarks/vs_plain_ddp.py --gpus 1,${NPROC:-4} --sides plain-ddp,ours-ddp --out "$OUT/vs_plain_ddp.json" \
    2>&1 | tail -6
  ;;
hsdp)
  H="--model llama-3-8b --method full --strategy fsdp --nproc-per-node ${NPROC:-4} --shard-size 2 --seq-len 4096"
  H="$H --batch-size 2 --grad-ckpt --optimizer adamw_fused"
  tb plan $H --gpu h200 2>&1 | grep -E "peak|tokens/s|bound" | head -4
  tb run $H --steps 8 --warmup 3 --run-timeout 240 --tag gpu-proof-hsdp 2>&1 | grep -E "status|tokens/s  |peak memory|MFU|setup|rror"
  ;;
ddppure)
  python3 benchmarks/vs_plain_ddp.py --gpus 1,${NPROC:-4} --sides ours-ddp,ours-ddp-pure \
    --out "$OUT/vs_plain_ddp_pure.json" 2>&1 | tail -6
  ;;
fsdptrace)  # Llama-3-8B FSDP2 with per-block checkpointing vs the plain script: ours with the checkpoint traced
  # inside the compiled block (the default) and with Hugging Face's around its call (ckpt_traced: false)
  python3 benchmarks/vs_plain_fsdp.py --gpus ${NPROC:-2} --batch-size 2 --steps 15 --warmup 5 --side-timeout 200 \
    --sides ${SIDES:-plain-ckpt,ours-ckpt-around,ours-ckpt} --out "$OUT/fsdptrace.json" 2>&1 | tail -4
  ;;
ddpprof)
  python3 benchmarks/vs_plain_ddp.py --gpus 1,${NPROC:-2} --sides ${SIDES:-plain-ddp-prof,steps-ddp} \
    --out "$OUT/ddpprof.json" 2>&1 | grep -E "^(side |steps|plain|ours|    profile)"
  for e in ${NCCL_ENVS:-}; do  # each NAME=VALUE[,NAME=VALUE...]: our step at NPROC GPUs with those set
    env ${e//,/ } python3 benchmarks/vs_plain_ddp.py --gpus ${NPROC:-2} --sides steps-ddp \
      --out "$OUT/ddpprof_${e//[=,]/_}.json" 2>&1 | grep -E "^(steps|    profile)" | sed "s|^|$e |"
  done
  ;;
ddpbuckets)  # issue 15: our TinyGPT DDP step compiled whole, at 1 GPU and NPROC (4), for each DDP bucket size of BUCKETS
  for w in 1 ${NPROC:-4}; do
    for mb in ${BUCKETS:-25 100 250}; do
      log="$OUT/ddpbuckets_w${w}_${mb}.log"
      timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node $w benchmarks/ddp_probe.py --scope model \
        --variants base --bucket-mb $mb --out "$OUT/ddpbuckets_w${w}_${mb}.json" > "$log" 2>&1 || tail -3 "$log"
      grep -A2 "^scope=" "$log"
    done
  done
  ;;
ddpprobe)
  probe() {  # probe WORLD ARGS...: one torchrun job, its table printed (its log's tail if it failed)
    local log="$OUT/ddpprobe_$((++n)).log"
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$@" > "$log" 2>&1 || tail -4 "$log"
    grep -A12 "^scope=" "$log"
  }
  n=0
  for scope in ${SCOPES:-blocks model}; do
    for w in 1 ${NPROC:-2}; do
      probe $w benchmarks/ddp_probe.py --scope $scope --variants ${VARIANTS:-base,no-sync} --trace 5 \
        ${BUCKET_MB:+--bucket-mb $BUCKET_MB} --out "$OUT/ddpprobe_${scope}_w$w.json"
    done
  done
  [ -n "${SIDES:-}" ] && python3 benchmarks/vs_plain_ddp.py --gpus 1,${NPROC:-2} --sides "$SIDES" \
    --out "$OUT/ddpprobe_vs.json" 2>&1 | tail -6
  ;;
keep7b)
  K="--model mistral-7b --seq-len 512 --batch-size 8 --steps 24 --warmup 8 --ours ${OURS:-ckpt,ckpt+mm,none}"
  K="$K --profile ${PROFILE:-ckpt}"
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method lora $K --out "$OUT/keep7b_lora.json" \
    > "$OUT/keep7b_lora.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 python3 benchmarks/vs_hf_trainer.py --method qlora $K --out "$OUT/keep7b_qlora.json" \
    > "$OUT/keep7b_qlora.txt" 2>&1 &
  wait
  tail -n 22 "$OUT/keep7b_lora.txt" "$OUT/keep7b_qlora.txt"
  ;;
families)
  CHECKS=${CHECKS-flex,packed,experts,softcap,compiled}
  if [ "$CHECKS" != none ]; then
    python3 benchmarks/family_checks.py --checks "$CHECKS" --out "$OUT/family_checks.json" 2>&1 | grep -E '^\{' \
      | cut -c1-400
  fi
  for m in ${MODELS:-qwen3-8b}; do
    for meth in ${METHODS:-lora qlora}; do
      python3 benchmarks/vs_hf_trainer.py --model "$m" --method "$meth" --seq-len "${SEQ:-512}" \
        --batch-size "${BATCH:-8}" --steps "${STEPS:-20}" --warmup "${WARMUP:-8}" --targets "${TARGETS:-all-linear}" \
        ${NOHF:+--no-hf} ${NOOURS:+--no-ours} ${NOPREP:+--no-hf-kbit-prep} ${HFATTN:+--hf-attn "$HFATTN"} \
        --out "$OUT/fam_${m}_${meth}${NAME:-}.json" \
        2>&1 | tail -n 9
    done
  done
  ;;
lora7b)
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/vs_hf_trainer.py --method lora --model mistral-7b --seq-len 512 \
    --batch-size 8 --steps 30 --warmup 10 --out "$OUT/vs_hf_trainer_lora.json" 2>&1 | tail -6
  ;;
plainddp)
  python3 benchmarks/vs_plain_ddp.py --gpus 1,${NPROC:-4} --sides plain-ddp,ours-ddp,plain-zero2,ours-zero2 \
    --out "$OUT/vs_plain_ddp.json" 2>&1 | tail -12
  ;;
gpt2cal)
  # TinyGPT as users run it now (compile auto, the loss's matmuls aligned): each strategy on 2 GPUs, one GPU
  # eager and compiled, batch 8 and the seeds' batch 1 x accumulation 4
  T="--model tinygpt-124m --seq-len 2048 --steps 20 --warmup 8 --tag gpu-proof-gpt2cal"
  tb run $T --batch-size 8 --no-compile 2>&1 | grep -E "tokens/s  |peak memory"
  tb run $T --batch-size 8 2>&1 | grep -E "tokens/s  |peak memory"
  for s in ddp fsdp zero2 zero3; do
    tb run $T --batch-size 8 --strategy $s --nproc-per-node 2 2>&1 | grep -E "tokens/s  |peak memory"
  done
  for s in ddp zero2; do
    tb run $T --batch-size 1 --grad-accum 4 --strategy $s --nproc-per-node 2 2>&1 | grep -E "tokens/s  |peak memory"
  done
  ;;
launch1)
  export CUDA_VISIBLE_DEVICES=0
  # eager: the launch's own cost is seconds, and compiling takes tens of them
  T="--model tinygpt-124m --seq-len 1024 --batch-size 4 --steps 6 --warmup 2 --nproc-per-node 1 --no-compile"
  T="$T --tag gpu-proof-launch1"
  # each strategy with this tree's code, then (where .whl/oldsrc/src holds an earlier tree) with that one
  for s in ${STRATEGIES:-ddp fsdp zero2 zero3}; do
    for src in src .whl/oldsrc/src; do
      [ -d "$src" ] || continue
      start=$(date +%s.%N)
      PYTHONPATH=/tmp/site:$PWD/$src tb run $T --strategy $s --json > "$OUT/launch1.json" 2> "$OUT/launch1.err"
      echo "$src $s: exit $? wall $(python3 -c "print(round($(date +%s.%N) - $start, 2))") s," \
        "$(python3 -c "import json; r = json.load(open('$OUT/launch1.json')); print(r['status'], r['metrics']['tokens_per_s'])")," \
        "shm_comm lines $(grep -c shm_comm "$OUT/launch1.err")"
    done
  done
  export TUNEBENCH_CACHE=/tmp/tbcache
  python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 8000 > /dev/null
  F="--model tinygpt-124m --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --strategy fsdp"
  F="$F --nproc-per-node 1 --seq-len 512 --batch-size 8 --max-steps 40 --save-every 10 --log-every 5"
  F="$F --output-dir /tmp/launch1 --tag gpu-proof-launch1"
  rm -rf /tmp/launch1
  python3 -m tunebench.cli train $F > "$OUT/launch1-train.log" 2>&1 &
  job=$!
  until grep -q "train: step 2[0-9]/40" "$OUT/launch1-train.log" || ! kill -0 $job 2>/dev/null; do sleep 0.5; done
  kill -TERM $job; wait $job; echo "stopped by SIGTERM: exit $? (75: checkpoint saved)"
  tb train $F --resume latest 2>&1 | grep "^train:\|resum"; echo "resumed: exit ${PIPESTATUS[0]}"
  ;;
scopefit)
  export CUDA_VISIBLE_DEVICES=0 TUNEBENCH_CACHE=/tmp/tbcache
  if [ -n "${LOGLINE:-}" ]; then
    python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 1000 > /dev/null  # tiny-llama's 1,024 embeddings
    F="--model tiny-llama --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --seq-len 256"
    F="$F --batch-size 8 --log-every 1 --save-every 6 --output-dir /tmp/logline --no-compile --tag gpu-proof-logline"
    tb train $F --max-steps 6 > "$OUT/logline-a.log" 2>&1; echo "first 6 steps: exit $?"
    tb train $F --max-steps 10 --resume latest > "$OUT/logline-b.log" 2>&1; echo "resumed to 10: exit $?"
    grep "^train: step" "$OUT/logline-a.log" "$OUT/logline-b.log"
  fi
  # one shape a line: the run's arguments; each runs per block, then whole (the default for full fine-tuning)
  SHAPES=${SHAPES:-"--model tinygpt-124m --seq-len 2048 --batch-size 8"}
  while IFS= read -r shape; do
    [ -n "$shape" ] || continue
    for scope in blocks model; do
      timeout 300 python3 -m tunebench.cli run $shape --steps 20 --warmup 8 --compile-scope $scope --tag scopefit \
        > "$OUT/scope.log" 2>&1
      echo "$shape --compile-scope $scope: exit $?; $(grep -v "step [0-9]*/" "$OUT/scope.log" | tail -2 | tr '\n' ' ')"
      tb results export --format jsonl -o "$OUT/results.jsonl" > /dev/null  # what has run, if the call is cut
    done
  done <<< "$SHAPES"
  ;;
host1)
  export CUDA_VISIBLE_DEVICES=0
  for i in 1 2 3; do tb hw --sections host --tag gpu-proof-host 2>&1 | grep "host dispatch"; done
  SHAPES=${SHAPES:-"--model tinygpt-124m --seq-len 512 --batch-size 16"} bash "$0" scopefit
  ;;
hostgraph)
  export CUDA_VISIBLE_DEVICES=0
  for i in 1 2 3; do tb hw --sections host --tag gpu-proof-host 2>&1 | grep "host dispatch"; done
  RUNS=${RUNS:-"--model tinygpt-124m --seq-len 512 --batch-size 4
--model tinygpt-124m --seq-len 2048 --batch-size 1
--model tinygpt-124m --seq-len 512 --batch-size 16
--model tinygpt-124m --seq-len 512 --batch-size 16 --compile-scope blocks"} TAG=${TAG:-hostgraph} bash "$0" runs
  ;;
peakparts)  # each of RUNS (`tunebench run` flags, bf16 compiled whole unless they say) with its recorded peak taken
  # apart (peak_parts.py; PEAK_PARTS_TRACE=1: what the graphs' pools held at their largest), then train jobs (TRAIN=0
  # skips; MODELS)
  export CUDA_VISIBLE_DEVICES=0
  RUNS=${RUNS:-"--model llama-3.2-1b --seq-len 1024 --batch-size 4 --grad-accum 1
--model llama-3.2-1b --seq-len 1024 --batch-size 4 --grad-accum 2
--model llama-3.2-1b --seq-len 1024 --batch-size 4 --grad-accum 2 --no-cuda-graphs
--model tinygpt-124m --seq-len 1024 --batch-size 4 --grad-accum 2 --dropout 0"}
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    echo "== run $args"
    timeout 300 python3 benchmarks/peak_parts.py run --precision bf16 --compile --compile-scope model $args \
      --steps 20 --warmup 8 --tag peakparts 2>&1 | grep -E "PEAK PARTS|POOL|tokens/s  |peak|rror" | grep -v "step [0-9]*/"
  done <<< "$RUNS" | tee "$OUT/peak-parts.txt"
  if [ "${TRAIN:-1}" = 1 ]; then
    python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000 > /dev/null
    for model in ${MODELS:-llama-3.2-1b tinygpt-124m}; do
      echo "== train $model"
      python3 benchmarks/peak_parts.py train --model "$model" --tokenizer /tmp/corpus/tokenizer \
        --data /tmp/corpus/stdlib.jsonl --seq-len 1024 --batch-size 4 --grad-accum 2 --max-steps 60 --lr 1e-3 \
        --warmup-steps 10 --eval-fraction 0.02 --eval-every 30 --eval-batches 10 --log-every 20 --precision bf16 \
        --dropout 0 --tag peakparts --output-dir "/tmp/peak-$model" 2>&1 | grep -E "PARTS|^train:|tokens/s  |rror"
    done | tee -a "$OUT/peak-parts.txt"
  fi
  tb results export --format jsonl -o "$OUT/results.jsonl" > /dev/null
  ;;
packed)
  export CUDA_VISIBLE_DEVICES=0
  if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -rf -p no:cacheprovider tests/test_packed_attention.py tests/test_attention.py 2>&1 \
      | grep -E "^FAILED|^E  |passed|failed" | head -20
  fi
  [ "${ATTN:-1}" = 0 ] || python3 benchmarks/packed_attention.py 2>&1 | grep -v Warning | tee "$OUT/packed-attention.txt"
  python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000 > /dev/null
  C="--model ${MODEL:-tinygpt-124m} --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl"
  C="$C --seq-len ${SEQ:-1024} --batch-size ${BATCH:-4} --grad-accum 2 --max-steps ${STEPS:-120} --lr 1e-3"
  C="$C --warmup-steps 20 --eval-fraction 0.02 --eval-every 60 --eval-batches 10 --log-every 20 --dropout 0 --tag packed"
  for job in ${JOBS:-"varlen:--precision,bf16" "mask:--precision,bf16" "unpacked:--precision,bf16,--no-packing"}; do
    name=${job%%:*}; flags=${job#*:}  # JOBS: name:flags joined by commas; "mask" turns varlen off
    echo "== train $name ${flags//,/ }"
    TUNEBENCH_VARLEN=$([ "${name%%-*}" = mask ] && echo 0 || echo 1) tb train $C ${flags//,/ } \
      --output-dir "/tmp/packed-$name" 2>&1 | grep -E "^train:|tokens/s  |eval|rror" | tail -6
  done | tee -a "$OUT/packed-train.txt"
  tb results export --format jsonl -o "$OUT/results.jsonl" > /dev/null
  ;;
fp32)
  export CUDA_VISIBLE_DEVICES=0
  if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -rf -p no:cacheprovider tests/test_attention.py tests/test_tf32.py tests/test_compile.py \
      -k "attention or attend or tf32 or whole_model_compile" 2>&1 | grep -E "^FAILED|^E  |passed|failed" | head -20
  fi
  if [ "${TRAIN:-0}" = 1 ]; then  # GPT-2 small from scratch on the standard library, fp32 exact and with TF32
    python3 benchmarks/stdlib_corpus.py /tmp/corpus --vocab 32000 > /dev/null
    C="--model tinygpt-124m --tokenizer /tmp/corpus/tokenizer --data /tmp/corpus/stdlib.jsonl --seq-len 1024"
    C="$C --batch-size 4 --grad-accum 2 --max-steps 120 --lr 1e-3 --warmup-steps 20 --eval-fraction 0.02"
    C="$C --eval-every 60 --eval-batches 10 --log-every 20 --precision fp32 --dropout 0 --tag fp32-train"
    for g in ${TRAINS:-"," "--tf32"}; do  # TRAINS: each job's extra flags joined by commas ("," for none)
      echo "== train fp32 ${g//,/ }"; tb train $C ${g//,/ } --output-dir "/tmp/fp32${g//,/}" 2>&1 \
        | grep -E "^train:|tokens/s  |rror"
    done
  fi
  RUNS=${RUNS:-"--model llama-3.2-1b --precision fp32 --seq-len 2048 --batch-size 2
--model llama-3.2-1b --method lora --precision fp32 --seq-len 1024 --batch-size 4
--model llama-3.2-1b --precision fp32 --seq-len 1024 --batch-size 2 --no-compile
--model tinygpt-124m --precision fp32 --seq-len 2048 --batch-size 8 --dropout 0"}
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    timeout 300 python3 -m tunebench.cli run $args --steps 20 --warmup 8 --tag fp32 > "$OUT/run.log" 2>&1
    echo "$args: exit $?; $(grep "tokens/s\|peak" "$OUT/run.log" | grep -v "step [0-9]*/" | head -3 | tr -s ' ' | tr '\n' ' ')"
  done <<< "$RUNS"
  SHAPES=${SHAPES:-"--model llama-3.2-1b --precision fp32 --seq-len 2048 --batch-size 2
--model tinygpt-124m --precision fp32 --seq-len 2048 --batch-size 8"}
  while IFS= read -r shape; do
    [ -n "$shape" ] || continue
    echo "PROFILE $shape"
    timeout 200 python3 benchmarks/profile_trace.py $shape 2> "$OUT/prof.err" | tail -1 || tail -3 "$OUT/prof.err"
  done <<< "$SHAPES" | tee "$OUT/fp32-prof.txt"
  ;;
runs)
  export CUDA_VISIBLE_DEVICES=${GPUS:-0}
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    timeout 300 python3 -m tunebench.cli run $args --steps 20 --warmup 8 --tag "${TAG:-runs}" > "$OUT/run.log" 2>&1
    echo "$args: exit $?; $(grep "tokens/s\|peak" "$OUT/run.log" | grep -v "step [0-9]*/" | head -3 | tr -s ' ' | tr '\n' ' ')"
    tb results export --format jsonl -o "$OUT/results.jsonl" > /dev/null  # what has run, if the call is cut
  done <<< "$RUNS"
  ;;
scopeprof)
  export CUDA_VISIBLE_DEVICES=0
  SHAPES=${SHAPES:-"--model tinygpt-124m --seq-len 2048 --batch-size 8"}
  while IFS= read -r shape; do
    [ -n "$shape" ] || continue
    for scope in blocks model; do
      echo "PROFILE $shape --compile-scope $scope"
      timeout 240 python3 benchmarks/profile_trace.py $shape --compile-scope $scope 2> "$OUT/prof.err" | tail -1 \
        || tail -5 "$OUT/prof.err"
    done
  done <<< "$SHAPES" | tee "$OUT/scopeprof.txt"
  ;;
tracedsum)
  export CUDA_VISIBLE_DEVICES=0
  if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/test_loss.py 2>&1 | tail -2
    echo "the memory check with the head's gradient summed out of place (the form before): it must fail"
    python3 -c "import sys, pytest; from tunebench.engine import loss as L
L._accumulate_in_graph = lambda acc, a, b: acc.add_((a @ b).float())
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_loss.py', '-k', 'in_place']))" 2>&1 | grep "assert\|passed\|failed"
  fi
  python3 benchmarks/vs_traced_loss.py --shapes "${SHAPES:-llama-3.2-1b:4096:2,tinygpt-124m:2048:8}" \
    --sides "${SIDES:-ours,ours-sum}" --out "$OUT/traced_sum.json" 2>&1 | grep -v "^{" | tail -n 16
  ;;
peaklive)
  export CUDA_VISIBLE_DEVICES=0
  PROBES=${PROBES:-"model=tinygpt-124m batch_size=16 seq_len=512 compile_scope=model
model=tinygpt-124m batch_size=16 seq_len=512 compile_scope=blocks
model=tinygpt-124m batch_size=8 seq_len=2048 compile_scope=model
model=tinygpt-124m batch_size=8 seq_len=2048 compile_scope=blocks
model=llama-3.2-1b batch_size=2 seq_len=2048 compile_scope=model
model=llama-3.2-1b batch_size=2 seq_len=2048 compile_scope=blocks"}
  while IFS= read -r probe; do
    [ -n "$probe" ] || continue
    timeout 300 python3 benchmarks/memory_probe.py --peak-live --out "$OUT/peaklive.jsonl" "compile=true $probe" \
      2>&1 | grep -v "^\[" | cut -c 1-300
  done <<< "$PROBES"
  ;;
llama8b)
  tb run --model llama-3-8b --method full --strategy fsdp --nproc-per-node 4 --seq-len 4096 --batch-size 2 \
    --grad-ckpt --steps 12 --warmup 4 --optimizer adamw_fused --tag gpu-proof-llama8b 2>&1 | grep -v "step [0-9]*/"
  ;;
esac
if [ -f "$TUNEBENCH_STORE" ]; then  # cases that only run the side-by-side scripts store nothing
  tb results export --format jsonl -o "$OUT/results.jsonl"
  tb results list
fi
