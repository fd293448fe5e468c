#!/usr/bin/env bash
# GPU proof runs, sent to a device machine with .whl carried (see benchmarks/README.md).
#   bash benchmarks/gpu_proof.sh core      # issue 2: tinygpt-124m full bf16, mistral-7b QLoRA vs HF Trainer
set -uo pipefail
OUT=${OUT:-/tmp/tunebench-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
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
esac
tb results export --format jsonl -o "$OUT/results.jsonl"
tb results list
