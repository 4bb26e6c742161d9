"""Parity oracle: run by the python of an environment with sonar-space 0.5.0 + fairseq2 0.8.1.

Builds a tiny random-init SONAR text encoder and decoder with sonar-space's
own factories, runs them on fixed inputs, and writes to ``--out``:

* ``encoder.pt`` / ``decoder.pt``: the fairseq2 state dicts, ``{"model": ...}``
  as fairseq2 checkpoints are (loaded by memlab with ``weights_only=True``);
* ``config.json``: the sizes;
* ``io.safetensors``: inputs in fairseq2 token ids (``enc_ids``, ``enc_lens``,
  ``dec_ids``, ``dec_lens``) and outputs (``embeddings`` (B, D), teacher-forced
  ``logits`` (B, T, V)).

memlab's side (``tests/models/test_sonar_parity.py``) converts and compares.
Usage: ``$MEMLAB_SONAR_PYTHON tests/parity/sonar_oracle.py --out DIR``.
"""

import argparse
import json
from pathlib import Path

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.nn import BatchLayout
from safetensors.torch import save_file
from sonar.models.sonar_text.config import SonarTextDecoderConfig, SonarTextEncoderConfig
from sonar.models.sonar_text.factory import SonarTextDecoderFactory, SonarTextEncoderFactory

SIZES = dict(vocab_size=512, model_dim=64, layers=2, heads=4, ffn=128, max_seq_len=64)
FS2_EOS, FS2_PAD = 3, 0  # fairseq2 NLLB ids: <pad>=0, <unk>=1, <s>=2, </s>=3


def build(seed: int):
    s = SIZES
    vocab = VocabularyInfo(size=s["vocab_size"], unk_idx=1, bos_idx=2, eos_idx=3, pad_idx=1)  # as sonar's "basic" arch
    ecfg = SonarTextEncoderConfig(model_dim=s["model_dim"], max_seq_len=s["max_seq_len"], vocab_info=vocab,
                                  num_encoder_layers=s["layers"], num_decoder_layers=s["layers"],
                                  num_encoder_attn_heads=s["heads"], num_decoder_attn_heads=s["heads"],
                                  ffn_inner_dim=s["ffn"], pooling="mean", _from_fairseq=True)
    dcfg = SonarTextDecoderConfig(model_dim=s["model_dim"], max_seq_len=s["max_seq_len"], vocab_info=vocab,
                                  activation_fn="ReLU", no_scale_embedding=False, no_token_positional_embeddings=False,
                                  learned_pos=False, emb_dropout_p=0.1, attention_dropout_p=0.1, activation_dropout_p=0.1,
                                  normalize_before=True, num_encoder_layers=s["layers"], num_decoder_layers=s["layers"],
                                  num_encoder_attn_heads=s["heads"], num_decoder_attn_heads=s["heads"], ffn_inner_dim=s["ffn"])
    torch.manual_seed(seed)
    enc = SonarTextEncoderFactory(ecfg).create_model().eval()
    dec = SonarTextDecoderFactory(dcfg).create_model().eval()
    with torch.no_grad():  # move LayerNorms and biases off 1/0 so that every parameter is tested
        for m in (enc, dec):
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return enc, dec


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed + 1)
    lang = SIZES["vocab_size"] - 4  # any id stands in for a language token
    lens = [9, 5, 12]
    T = max(lens) + 2
    enc_ids = torch.full((len(lens), T), FS2_PAD, dtype=torch.long)
    dec_ids = torch.full((len(lens), T), FS2_PAD, dtype=torch.long)
    for i, n in enumerate(lens):
        toks = torch.randint(4, lang, (n,), generator=g)
        enc_ids[i, : n + 2] = torch.cat([torch.tensor([lang]), toks, torch.tensor([FS2_EOS])])  # [lang] x </s>
        dec_ids[i, : n + 2] = torch.cat([torch.tensor([FS2_EOS, lang]), toks])  # </s> [lang] x
    seq_lens = torch.tensor([n + 2 for n in lens])
    return enc_ids, dec_ids, seq_lens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    enc, dec = build(args.seed)
    enc_ids, dec_ids, lens = inputs(args.seed)
    with torch.no_grad():
        e_layout = BatchLayout.of(enc_ids, lens.tolist())
        emb = enc(enc_ids, e_layout).sentence_embeddings  # (B, D)
        memory = emb.unsqueeze(1)  # (B, 1, D): the decoder cross-attends to one vector
        m_layout = BatchLayout.of(memory, [1] * memory.shape[0])
        d_layout = BatchLayout.of(dec_ids, lens.tolist())
        hidden = dec.decode(dec_ids, d_layout, memory, m_layout)
        logits = dec.project(hidden)  # (B, T, V)
    torch.save({"model": {k: v.clone() for k, v in enc.state_dict().items()}}, out / "encoder.pt")
    torch.save({"model": {k: v.clone() for k, v in dec.state_dict().items()}}, out / "decoder.pt")
    save_file({"enc_ids": enc_ids, "dec_ids": dec_ids, "lens": lens, "embeddings": emb.contiguous(),
               "logits": logits.contiguous()}, str(out / "io.safetensors"))
    import fairseq2
    import sonar

    meta = {**SIZES, "seed": args.seed, "torch": torch.__version__, "fairseq2": fairseq2.__version__,
            "sonar": getattr(sonar, "__version__", "?")}
    (out / "config.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
