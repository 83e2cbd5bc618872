#!/usr/bin/env bash
# One short GPU check (<= 10 minutes): fp16 and bf16 AMP training steps of every head, each head's bf16 step eager
# and through torch.compile (the step times side by side, also one stderr line per head; --no-compile skips it), a
# 1-GPU NCCL DDP step (torchrun --nproc_per_node 1) and the decoders on the device; prints ONE JSON of timings.
# Without CUDA, or with --dry, it runs the CPU-feasible parts tiny, skips the CUDA parts with a message and
# exits 0 when those pass. Usage: scripts/gpu_check.sh [--dry] [--steps N] [--no-compile] [--compile-cpu]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# 600 s: compiling every head takes minutes
exec timeout 600 "$python" "$here/gpu_check.py" "$@"
