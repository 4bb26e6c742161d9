"""Pointwise information: what the embedding tells the decoder about each held-out chunk.

Pointwise V-information (Ethayarajh et al. 2022, after Xu et al. 2020's usable information): the bits a chunk costs
the control (the decoder of a constant embedding) minus what it costs the probe, its target tokens' NLL summed over
the chunk, ``(NLL_control - NLL_probe) / ln 2``. Its mean over the held-out chunks is the run's ``bits_per_chunk``.
A chunk with many bits is one the embedding helps the decoder rebuild; one near zero (or below) one it does not.

report.json's ``pointwise``: ``bits`` (one number per held-out chunk, in the held-out order), ``most`` and
``least`` (the :data:`SHOWN` chunks it helps most and least: index, bits, bits per target token and text).
"""

from __future__ import annotations

import math

import numpy as np

from memlab.probes.readings import ChunkScores

SHOWN = 3
"""The chunks the summary names at each end."""


def pointwise(probe: ChunkScores | None, control: ChunkScores | None, texts: list | None = None,
              shown: int = SHOWN) -> dict | None:
    """report.json's ``pointwise`` from the probe's and the control's numbers per held-out chunk (None: either
    missing)."""
    if probe is None or control is None:
        return None
    bits = (np.asarray(control.nll, dtype=np.float64) - np.asarray(probe.nll, dtype=np.float64)) / math.log(2)
    tokens = np.maximum(np.asarray(probe.tokens, dtype=np.float64), 1)
    order = np.argsort(-bits, kind="stable")

    def row(i: int) -> dict:
        return {"index": int(i), "bits": float(bits[i]), "bits_per_token": float(bits[i] / tokens[i]),
                "text": texts[i] if texts is not None and i < len(texts) else None}

    k = min(shown, len(bits))
    return {"bits": [round(float(b), 4) for b in bits], "most": [row(i) for i in order[:k]],
            "least": [row(i) for i in order[::-1][:k]],
            "definition": "per held-out chunk: (NLL_control - NLL_probe) summed over its target tokens, in bits "
                          "(pointwise V-information); their mean is bits_per_chunk"}


def summary_lines(pw: dict | None, width: int = 70) -> list[str]:
    """The summary's lines: the chunks the embedding helps most and least."""
    if not pw or not pw.get("most"):
        return []

    def show(r: dict) -> str:
        text = (r["text"] or "").replace("\n", " ")
        text = text if len(text) <= width else text[: width - 3] + "..."
        return f"    {r['bits']:+.1f} bits ({r['bits_per_token']:+.2f} a token): {text!r}"

    return (["chunks the embedding helps most (pointwise information):"] + [show(r) for r in pw["most"]]
            + ["and least:"] + [show(r) for r in pw["least"]])
