#!/usr/bin/env bash
# The GPU check: every toy config in bf16 on CUDA, a 2-GPU launch where two GPUs exist, a SONAR-LLM step at
# SONAR's real shape, a probe of a ~1B Llama-shaped model, then `memlab quickstart` and `memlab probe --model
# smollm2` with no device flag; one line per check with peak memory, tokens/s and MFU. `--device cpu --tiny`
# runs the same plan on the CPU at tiny sizes (CI does). Options: `bash scripts/gpu_check.sh --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
