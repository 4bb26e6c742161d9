"""The online (prequential) code of the training chunks given the embedding, against the control's.

Minimum description length probing (Voita & Titov 2020, "Information-theoretic probing with minimum description
length"): a probe that reads an embedding easily needs few chunks to learn it, and the online code charges it for
the learning. The training chunks (in the probe's seeded random order) are sent block by block: the first block
(``t_1`` chunks) under the uniform code over the full vocabulary (``ln V`` nats a target token), each next block
``[t_i, t_{i+1})`` under the decoder trained on the first ``t_i`` chunks. The blocks are the learning curve's sizes
(:mod:`memlab.probes.readouts.saturation`), so the decoders the curve trains are the code's: nothing is trained for it alone.

The same code is taken for the control (the decoder on a constant embedding, trained on the same blocks), so:

* ``probe_bits`` / ``control_bits``: the two codes of all the training chunks, in bits;
* ``bits_per_chunk``: what the embedding saves, ``(control code - probe code) / N`` (mean over the N sent chunks);
* ``compression``: ``control code / probe code`` (1: the embedding saves nothing; Voita & Titov's compression is
  ``uniform / code``: ``uniform_compression`` gives it for both);

each with the percentile interval of a paired bootstrap over the sent chunks (probe and control codes of a chunk
drawn together, :func:`memlab.probes.readings.bootstrap`). A constant embedding's probe *is* its control
(:func:`memlab.probes.decoder.fit.fit_decoders`), so its code equals the control's exactly: compression 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memlab.probes.readings import Reading, bootstrap

LN2 = math.log(2)


@dataclass
class Block:
    """One block of the code: chunks ``[start, end)`` of the training order, each chunk's code (nats) under the
    probe and under the control trained on the first ``start`` chunks (``start == 0``: the uniform code), and each
    chunk's target tokens."""

    start: int
    end: int
    probe_nll: np.ndarray
    control_nll: np.ndarray
    tokens: np.ndarray


def uniform_block(end: int, tokens: np.ndarray, vocab_size: int) -> Block:
    """The first block, chunks ``[0, end)``, under the uniform code: ``ln V`` nats per target token, for both."""
    nll = np.asarray(tokens, dtype=np.float64) * math.log(vocab_size)
    return Block(0, end, nll, nll.copy(), np.asarray(tokens))


def online_code(blocks: list[Block], vocab_size: int, n_resamples: int = 2000, level: float = 0.95,
                seed: int = 0) -> dict:
    """report.json's ``online_code`` from the code's blocks (the first the uniform one), in order."""
    p = np.concatenate([b.probe_nll for b in blocks]).astype(np.float64)  # (N,) nats
    c = np.concatenate([b.control_nll for b in blocks]).astype(np.float64)  # (N,)
    tok = np.concatenate([b.tokens for b in blocks]).astype(np.float64)  # (N,)
    uni = tok * math.log(vocab_size)
    cols = {"p": p, "c": c, "u": uni}
    stats = {"bits_per_chunk": lambda x: (x["c"] - x["p"]).mean(-1) / LN2,
             "compression": lambda x: x["c"].sum(-1) / np.maximum(x["p"].sum(-1), 1e-12)}
    out = {}
    for name, stat in stats.items():
        value = float(stat({k: v[None] for k, v in cols.items()})[0])
        lo, hi = bootstrap(stat, cols, n_resamples, level, seed)
        out[name] = Reading(value, lo, hi).to_dict()
    return {
        **out,
        "probe_bits": float(p.sum() / LN2), "control_bits": float(c.sum() / LN2), "uniform_bits": float(uni.sum() / LN2),
        "n_chunks": int(p.shape[0]),
        "uniform_compression": {"probe": float(uni.sum() / max(p.sum(), 1e-12)),
                                "control": float(uni.sum() / max(c.sum(), 1e-12))},
        "blocks": [{"start": b.start, "end": b.end, "trained_on": b.start,
                    "probe_bits": float(b.probe_nll.sum() / LN2), "control_bits": float(b.control_nll.sum() / LN2)}
                   for b in blocks],
        "definition": "online (prequential) code of the training chunks, in their seeded order: the first block "
                      "under the uniform code (ln V nats a target token), each next block under the decoder "
                      "trained on the chunks before it (the learning curve's fits), for the probe and for the "
                      "control; bits_per_chunk = (control code - probe code) / chunks sent, compression = control "
                      "code / probe code, 95 % paired bootstrap intervals over the sent chunks",
    }


def readings_of(code: dict | None) -> dict[str, Reading]:
    """The code's two readings as the report's ``readings`` hold them (``online_bits_per_chunk``,
    ``online_compression``)."""
    if not code:
        return {}
    return {"online_bits_per_chunk": Reading.of(code["bits_per_chunk"]),
            "online_compression": Reading.of(code["compression"])}
