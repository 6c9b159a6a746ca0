#!/usr/bin/env bash
# The checks that need a GPU, in one run on a GPU node (the CI machine has none); about 9 minutes
# on one H200, every part with its own time limit so that one that hangs takes no other with it:
#
#     benchmarks/gpu_node.sh [OUT_DIR]          # PYTHON=... to use another interpreter
#
#  1. the GPU, and what Shipyard discovers of it;
#  2. the tests marked `gpu`;
#  3. training throughput, bare loop / Shipyard job / HF Trainer, for a 125M- and a 1B-shaped
#     model (the Shipyard job compiles its blocks and uses the fused kernels: MFU and memory
#     beside the planner's);
#  4. a 7B-shaped job on one GPU: full activation checkpointing and bf16 Adam moments;
#  5. a sharded checkpoint's write speed against one torch.save;
#  6. the chunked loss over a 128K vocabulary against F.cross_entropy;
#  7. torchtitan on the same 1B shape, where it can be installed (the node may have no network);
#  8. fine-tuning: a Shipyard job vs PEFT + Trainer, LoRA and full, bf16;
#  9. the share of peak each kernel of a transformer layer reaches (GEMMs by shape, attention,
#     memory-bound kernels; every product of OpenXLA's 256-4096 grid, with its fitted fixed cost:
#     keep kernels.json in benchmarks/data/), and where a 125M-shaped step's time goes;
# 10. the host's time to queue a step's kernels against the GPU's time to run them.
# Every figure is also written to OUT_DIR.
set -u
py=${PYTHON:-.venv/bin/python}
out=${1:-benchmarks/out/gpu}
mkdir -p "$out"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))'
"$py" -m shipyard.cli.main devices

# QLoRA's 4-bit kernels (CUDA only; not installed on CPU machines).
"$py" -m pip install --quiet 'bitsandbytes>=0.43' || echo "bitsandbytes could not be installed: the QLoRA test skips"

timeout 120 "$py" -m pytest -m gpu tests/integration/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$out/pytest.txt"

run() {  # NAME LIMIT SCRIPT [OPTIONS...]: the figures as JSON in OUT_DIR, the log beside them
    local name=$1 limit=$2 script=$3
    shift 3
    timeout "$limit" "$py" "benchmarks/$script" "$@" --json >"$out/$name.json" 2>"$out/$name.log"
    echo "== $name (exit $?)"
    tail -n 3 "$out/$name.log"
    cat "$out/$name.json"
}
run train-125m 110 train_throughput.py --device cuda --preset llama-125m --micro 16 --seq-len 1024 \
    --batch-tokens 65536 --steps 20 --rounds 2
run train-1b 140 train_throughput.py --device cuda --preset llama-1b --micro 8 --seq-len 1024 \
    --batch-tokens 32768 --steps 10 --rounds 1
run train-7b 110 train_throughput.py --device cuda --preset llama-7b --micro 2 --seq-len 2048 \
    --batch-tokens 16384 --steps 6 --rounds 1 --ways "Shipyard runtime" --checkpointing full --state-dtype bf16
run checkpoint-1b 60 checkpoint_write.py --device cuda --preset llama-1b --rounds 2
run fused-loss 40 fused_loss.py --device cuda --tokens 16384 --hidden 2048 --vocab 128256 --rounds 3

# torchtitan beside Shipyard on the 1B shape, when the node can install it.
if timeout 60 "$py" -m pip install --quiet torchtitan >"$out/torchtitan-install.log" 2>&1; then
    echo "torchtitan installed: run its llama3 debug config at the 1B shape by hand (see docs/benchmarks.md)"
else
    echo "torchtitan could not be installed here (no network?): no side-by-side run"
fi

timeout 120 "$py" benchmarks/finetune_throughput.py --device cuda --precision bf16 --hidden 1024 --layers 12 \
    --micro 16 --seq-len 256 --steps 20 --json >"$out/finetune.json" 2>"$out/finetune.log"
cat "$out/finetune.json"

run kernels 130 kernel_efficiency.py --device cuda --hiddens 768,2048,4096,8192 --tokens 2048,8192,32768 \
    --seq-lens 1024,4096 --grid 256,512,1024,2048,4096
run step-profile-125m 100 step_profile.py --preset llama-125m --micro 16 --seq-len 1024 --steps 8
run host-dispatch 150 host_dispatch.py --presets llama-12m,llama-125m,llama-1b --micros 1,16
