"""The shipped small decoder for memlab's BPE (memlab/resources/checkpoints/token_lm-decoder, shortcut memlab-lm):
it loads as a Llama causal LM with memlab's tokenizer, and its README's validation loss is reproduced."""

from __future__ import annotations

import re

import pytest
import torch

from memlab.paths import resource

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED = resource("checkpoints") / "token_lm-decoder"


def test_the_shortcut_names_the_shipped_folder_and_it_loads_as_a_llama_lm_with_memlabs_tokenizer():
    from transformers import LlamaForCausalLM

    from memlab.probes.encoders.sources import load_tokenizer, resolve_source

    folder, gguf, pool = resolve_source("memlab-lm")
    assert folder == str(SHIPPED) and gguf is None and pool == "last"
    model = LlamaForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float32 and not (SHIPPED / "optimizer.pt").exists()
    tok, ref = load_tokenizer("memlab-lm"), load_tokenizer(str(resource("checkpoints") / "memory_ae-small"))
    assert len(tok) == len(ref) == model.config.vocab_size and tok.get_vocab() == ref.get_vocab()
    n = sum(p.numel() for p in model.parameters())
    assert f"{n:,} parameters" in (SHIPPED / "README.md").read_text()


def test_its_readme_validation_loss_is_reproduced_on_validation_chunks():
    from transformers import LlamaForCausalLM

    from memlab.config import load_config
    from memlab.data.stream import stream_corpus
    from memlab.models.token_lm.recipe import causal_lm_step
    from memlab.paths import shipped_config

    readme = (SHIPPED / "README.md").read_text()
    loss = float(re.search(r"next-token loss ([0-9.]+) nats", readme).group(1))
    cfg = load_config(shipped_config("token_lm/decoder_small.yaml"))
    val = stream_corpus(cfg.data, tokenizer_spec=str(SHIPPED)).chunks("validation", cfg.data.seq_len)
    ids = torch.as_tensor(val[:: max(1, len(val) // 192)][:192].astype("int64"))  # (192, 64) spread over the split
    model = LlamaForCausalLM.from_pretrained(SHIPPED).eval()
    with torch.no_grad():
        got = float(causal_lm_step(model, {"input_ids": ids}).loss)
    assert abs(got - loss) < 0.15, (got, loss)
