#!/usr/bin/env bash
# The GPU check (not part of CI): every toy config in bf16 on CUDA, a 2-GPU launch where two GPUs exist,
# a SONAR-LLM step at SONAR's real shape and a probe of a ~1B Llama-shaped model; one line per check with
# peak memory, tokens/s and MFU. Options: see `bash scripts/gpu_check.sh --help` (scripts/gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
