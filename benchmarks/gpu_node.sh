#!/usr/bin/env bash
# The checks that need a GPU, in one run on a GPU node (the CI machine has none):
#
#     benchmarks/gpu_node.sh [OUT_DIR]          # PYTHON=... to use another interpreter
#
# Prints the GPU and what Shipyard discovers of it, runs the tests marked `gpu`, then the training
# throughput benchmark (bare loop / Shipyard job / HF Trainer) on the first GPU for a 125M-shaped
# and a 1B-shaped model. Each part has its own time limit, so one that hangs does not take the
# others with it; the figures are also written to OUT_DIR.
set -u
py=${PYTHON:-.venv/bin/python}
out=${1:-benchmarks/out/gpu}
mkdir -p "$out"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))'
"$py" -m shipyard.cli.main devices

# QLoRA's 4-bit kernels (CUDA only; not installed on CPU machines).
"$py" -m pip install --quiet 'bitsandbytes>=0.43' || echo "bitsandbytes could not be installed: the QLoRA test skips"

timeout 200 "$py" -m pytest -m gpu tests/integration/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/pytest.txt"

throughput() {  # NAME, then the benchmark's options
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$py" benchmarks/train_throughput.py --device cuda "$@" --json \
        >"$out/train-$name.json" 2>"$out/train-$name.log"
    cat "$out/train-$name.log" "$out/train-$name.json"
}
throughput 125m 170 --preset llama-125m --micro 16 --seq-len 1024 --batch-tokens 65536 --steps 20 --rounds 2
throughput 1b 200 --preset llama-1b --micro 8 --seq-len 1024 --batch-tokens 32768 --steps 8 --rounds 1

# Fine-tuning: a Shipyard job vs PEFT + Trainer on the GPU, LoRA and full, bf16.
timeout 240 "$py" benchmarks/finetune_throughput.py --device cuda --precision bf16 --hidden 1024 --layers 12 \
    --micro 16 --seq-len 256 --steps 20 --json >"$out/finetune.json" 2>"$out/finetune.log"
cat "$out/finetune.json"
