"""Robustness of the certificate: exact recovery against noise on the states and against other weights.

* :func:`quantized_copy`: a copy of a model whose matrices went through a GGUF quantiser and back (the ``gguf``
  package's ``gguf.quants``: Q8_0, Q5_0, Q4_0, Q4_1, ...), the weights a quantised file would give;
* :func:`recovery`: the chunks inverted from given states, as figures (exact match, token accuracy, certificates).

The benchmark ``benchmarks/invert_robustness.py`` sweeps both and draws the curve.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from memlab.errors import ModelError
from memlab.probes.invert.positions.searcher import Searcher
from memlab.probes.invert.report import CERTIFICATES, CERTIFIED


def quantized_copy(model: nn.Module, qtype: str) -> nn.Module:
    """``model`` with every 2-D weight (linear layers, embeddings) quantised to GGUF type ``qtype`` and dequantised
    again (rows whose length is not a multiple of the type's block size stay as they are)."""
    try:
        from gguf import GGMLQuantizationType, quants
        from gguf.constants import GGML_QUANT_SIZES
    except ImportError:
        raise ModelError("quantised copies need the gguf package: pip install 'memlab[assets]'") from None
    try:
        q = GGMLQuantizationType[qtype]
    except KeyError:
        raise ModelError(f"unknown GGUF quantisation type {qtype!r}; e.g. Q8_0, Q5_0, Q4_0, Q4_1") from None
    block = GGML_QUANT_SIZES[q][0]
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            if p.dim() == 2 and p.shape[1] % block == 0:
                w = p.detach().float().cpu().numpy()
                back = quants.dequantize(quants.quantize(np.ascontiguousarray(w), q), q)
                p.copy_(torch.from_numpy(np.asarray(back, dtype=np.float32).reshape(w.shape)))
    return out


def relative_error(a: nn.Module, b: nn.Module) -> float:
    """Mean over 2-D weights of ``|w_a - w_b| / |w_a|`` (Frobenius norms): how far a quantised copy moved."""
    errs = [float((pa - pb).norm() / pa.norm().clamp_min(1e-30))
            for pa, pb in zip(a.parameters(), b.parameters()) if pa.dim() == 2]
    return sum(errs) / max(len(errs), 1)


def recovery(searcher: Searcher, prefix: list[int], chunks: list[list[int]], states: list[torch.Tensor],
             table: torch.Tensor | None = None) -> dict:
    """Invert each chunk from its ``states`` ``(T, D)``: exact match, token accuracy, the certificates and the
    median best relative distance (``table``: the searcher's first-position states, when kept)."""
    firsts = searcher.first_positions(prefix, torch.stack([s[0] for s in states]), table=table)
    got = [searcher.chunk(s, prefix, ids, first=f) for ids, s, f in zip(chunks, states, firsts)]
    flat = [(p, t) for g, ids in zip(got, chunks) for p, t in zip(g, ids)]
    certs = [p.certificate for p, _ in flat]
    return {"exact_match": sum([p.token for p in g] == ids for g, ids in zip(got, chunks)) / len(chunks),
            "token_accuracy": sum(p.token == t for p, t in flat) / len(flat),
            "certified": sum(c in CERTIFIED for c in certs) / len(certs),
            **{k: certs.count(k) for k in CERTIFICATES},
            "median_distance": float(np.median([p.distance for p, _ in flat])),
            "median_gap": float(np.median([p.gap for p, _ in flat])),
            "seconds": sum(p.seconds for p, _ in flat)}
