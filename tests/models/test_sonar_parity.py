"""Parity with sonar-space/fairseq2 (the reference implementation), run in its own environment.

``tests/parity/sonar_oracle.py`` is run by the python of an environment with
sonar-space 0.5.0 + fairseq2 0.8.1 (torch 2.9.1): it builds a tiny random SONAR
with sonar-space's factories and saves its fairseq2 state dicts, inputs and
outputs. Here memlab converts the checkpoints and must reproduce the sentence
embeddings and the teacher-forced decoder logits (relative error <= 1e-5).

    MEMLAB_SONAR_PYTHON=/work/sonar-venv/bin/python pytest -m parity tests/models/test_sonar_parity.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PYTHON = os.environ.get("MEMLAB_SONAR_PYTHON", "/work/sonar-venv/bin/python")
ORACLE = Path(__file__).resolve().parents[1] / "parity" / "sonar_oracle.py"
TOL = 1e-5

pytestmark = pytest.mark.parity


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    if not Path(PYTHON).is_file():
        pytest.skip(f"no sonar-space environment at {PYTHON} (set MEMLAB_SONAR_PYTHON; see docs/sonar.md)")
    probe = subprocess.run([PYTHON, "-c", "import sonar, fairseq2"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{PYTHON} cannot import sonar-space and fairseq2: {probe.stderr.strip().splitlines()[-1:]}")
    out = tmp_path_factory.mktemp("sonar_oracle")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run([PYTHON, str(ORACLE), "--out", str(out), "--seed", "0"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_parity_with_sonar_space(oracle):
    from safetensors.torch import load_file

    from memlab.models.sonar.convert import FS2_TO_HF, fs2_ids_to_hf
    from memlab.models.sonar.space import load
    from memlab.models.sonar.tokenizer import build_toy_tokenizer

    meta = json.loads((oracle / "config.json").read_text())
    io = load_file(str(oracle / "io.safetensors"))
    tok = build_toy_tokenizer(vocab_size=meta["vocab_size"])
    space = load(f"{oracle}/encoder.pt,{oracle}/decoder.pt", tokenizer=tok, num_heads=meta["heads"],
                 max_position_embeddings=meta["max_seq_len"])
    model = space.model
    assert model.config.d_model == meta["model_dim"] and model.config.encoder_layers == meta["layers"]
    lens = io["lens"]  # (B,) real lengths, special tokens included
    T = io["enc_ids"].shape[1]
    mask = (torch.arange(T)[None] < lens[:, None]).long()  # (B, T)
    ref_z, ref_logits = io["embeddings"], io["logits"]  # (B, D), (B, T, V) in fairseq2 token order
    perm = torch.arange(ref_logits.shape[-1])
    for fs2, hf in FS2_TO_HF.items():
        perm[hf] = fs2
    ref_logits = ref_logits[..., perm]  # columns in memlab's token order
    with torch.no_grad():
        z = model.encode(fs2_ids_to_hf(io["enc_ids"]), mask).sentence_embedding  # (B, D)
        logits = model.decode(ref_z, fs2_ids_to_hf(io["dec_ids"]))  # (B, T, V)
        chained = model.decode(z, fs2_ids_to_hf(io["dec_ids"]))
    keep = mask.bool()
    errs = {"embeddings": _rel(z, ref_z), "logits": _rel(logits[keep], ref_logits[keep]),
            "logits_from_memlab_z": _rel(chained[keep], ref_logits[keep])}
    print(json.dumps({"relative_errors": errs, "oracle": meta}), file=sys.stderr)
    assert all(e <= TOL for e in errs.values()), errs
    # the space-level path (plain ids; the space adds [lang] ... </s> and padding itself) agrees too
    plain = fs2_ids_to_hf(io["enc_ids"][:, 1:-1])  # (B, T-2): drop [lang]; </s> sits inside for shorter rows
    plain_mask = (torch.arange(T - 2)[None] < (lens - 2)[:, None]).long()
    full, fmask = space.with_specials(plain, plain_mask)
    full[:, 0] = int(io["enc_ids"][0, 0])  # the oracle's stand-in language id
    with torch.no_grad():
        z2 = model.encode(full, fmask).sentence_embedding
    assert _rel(z2, ref_z) <= TOL
