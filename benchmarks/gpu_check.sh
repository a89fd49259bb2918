#!/usr/bin/env bash
# One short run on a GPU machine: the CUDA tests, then the GPU rows of the step-time tables.
#
# Prepare here, on a machine with network access, from the project's root:
#     bash ../shared/gpu/fetch-wheels.sh          # pyro-ppl, arviz, ... into the ignored .whl/
# then run this on the GPU machine from the project's root, carrying .whl along, e.g.
#     bash benchmarks/gpu_check.sh                 # about 8 minutes on an H100
# It writes into $OUT (or ./gpu_out): nvidia-smi.txt, cuda_tests.txt, steptime_cuda.md,
# steptime_throughput.md and steptime_user_networks.md. The numbers go into docs/performance.md ("GPU").
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"

if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "no .whl/: run 'bash ../shared/gpu/fetch-wheels.sh' first, where the network is" >&2
    exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, pyro; print(torch.__version__, pyro.__version__, torch.cuda.get_device_name())" \
    | tee "$OUT/versions.txt"

# 1. every test marked cuda (the captured step against the eager one, fits, resume, predict)
timeout 180 python3 -m pytest -q -n0 -m cuda -p no:cacheprovider tests/ > "$OUT/cuda_tests.txt" 2>&1
tail -3 "$OUT/cuda_tests.txt"

# 2. step time: the hand-written step eager and captured, fit captured (the default) and
#    eager; 1-50-50-1 and 784-400-400-10 (targets: <= 0.6 ms and <= 1.0 ms a step)
ROWS='reference (hand|captured|MeanFieldGuide, reparam|LowRankGuide(rank=4), reparam=None'
timeout 180 python3 benchmarks/steptime.py --device cuda --nets small,large --no-memory \
    --rounds 4 --only "$ROWS" > "$OUT/steptime_cuda.md" 2>&1
cat "$OUT/steptime_cuda.md"

# 3. throughput: 784-1200-1200-10 at batch 1024 (target >= 700,000 examples/s) and the ConvNet
timeout 150 python3 benchmarks/steptime.py --device cuda --nets small --throughput --no-memory \
    --rounds 2 --only "$ROWS" > "$OUT/steptime_throughput.md" 2>&1
tail -25 "$OUT/steptime_throughput.md"

# 4. networks as users write them: a ResNet-18 at 16-128 channels and an LSTM, fit's step
#    (captured) against the network's deterministic step and a hand-written every-parameter step
timeout 150 python3 benchmarks/steptime.py --device cuda --nets resnet,lstm --no-memory \
    --steps 5 --rounds 3 > "$OUT/steptime_user_networks.md" 2>&1
tail -22 "$OUT/steptime_user_networks.md"
