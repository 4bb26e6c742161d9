#!/usr/bin/env bash
# A wheel install works: build memlab's wheel, install it (not editable) into a fresh venv, and from a
# folder outside the source tree run `memlab quickstart --fast` (shipped checkpoints, then --retrain
# from the shipped configs) and `memlab eval` on the local task sets. Called by .ci/run.
#
# The fresh venv reads torch and the other dependencies from the site-packages of $PYTHON (set up
# by scripts/setup.sh) through a plain path file, so their .pth hooks, the editable install of this
# checkout among them, do not run there; memlab itself must come from the wheel (the script checks).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
[[ "$PY" == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # the script changes folders
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memlab-wheel.XXXXXX")
# pip builds in the source tree: remove the build/ folder it leaves unless one was there before
if [ -e "$SRC/build" ]; then trap 'rm -rf "$WORK"' EXIT; else trap 'rm -rf "$WORK" "$SRC/build"' EXIT; fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MEMLAB_CACHE="$WORK/cache"
t0=$(date +%s)
step() { echo "wheel_check [$(( $(date +%s) - t0 ))s]: $*"; }

step "building the wheel"
(cd "$SRC" && $PY -m pip wheel -q --no-deps -w "$WORK/dist" .)
WHEEL=$(ls "$WORK"/dist/memlab-*.whl)
$PY - "$WHEEL" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["memlab/configs/token_lm/toy.yaml", "memlab/configs/memory/ae_small.yaml",
        "memlab/resources/eval/hellaswag.jsonl", "memlab/resources/checkpoints/token_lm-toy/config.json",
        "memlab/models/__init__.py", "memlab/probes/__init__.py", "memlab/curricula/__init__.py"]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}"
assert not any(n.startswith(("tests/", "configs/", "models/")) for n in names), "top-level folders in the wheel"
PY

step "installing it into a fresh venv"
$PY -m venv "$WORK/venv"
deps=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_memlab_deps.pth
$PY -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' > "$deps"
"$WORK/venv/bin/python" -m pip install -q --no-deps --ignore-installed "$WHEEL"
mkdir -p "$WORK/outside" && cd "$WORK/outside"
"$WORK/venv/bin/python" - "$WORK/venv" "$SRC" <<'PY'
import sys
from pathlib import Path
import memlab, memlab.models, memlab.paths
venv, src = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
for m in (memlab, memlab.models):
    f = Path(m.__file__).resolve()
    assert f.is_relative_to(venv) and not f.is_relative_to(src), f"{m.__name__} comes from {f}, not the wheel"
assert memlab.paths.configs_dir().is_relative_to(venv), memlab.paths.configs_dir()
print("memlab from", Path(memlab.__file__).parent)
PY
MEMLAB="$WORK/venv/bin/memlab"

step "memlab quickstart --fast (shipped checkpoints)"
"$MEMLAB" quickstart --fast --only memory_ae token_lm random_init --out qs > qs.log
test -s qs/table.md && test -s qs/summary.json && test -s qs/quickstart.png

step "memlab quickstart --fast --retrain (from the shipped configs)"
"$MEMLAB" quickstart --fast --retrain --only memory_ae token_lm --out qs-retrain > qs-retrain.log
test -s qs-retrain/train-token_lm/summary.json && test -s qs-retrain/train-memory_ae/summary.json

step "memlab eval on the local task sets"
"$MEMLAB" eval --run qs-retrain/train-token_lm --task hellaswag --task multidoc_qa --limit 2 \
    --max-new-tokens 8 --out eval > eval.log
test -s eval/eval.json
"$WORK/venv/bin/python" - eval/eval.json <<'PY'
import json, sys
text = open(sys.argv[1]).read()
assert "hellaswag" in text and "multidoc_qa" in text, text[:500]
PY
step "passed"
