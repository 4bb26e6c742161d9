"""The code of the probe's own parts (see :mod:`memlab.probes.parts`): encoder kinds, poolings, conditionings,
token inputs, the read-outs' glue and the scorers. :mod:`memlab.probes.catalog` registers each by name
(``"memlab.probes.builtin_parts:NAME"``), so this module is imported the first time a part is used."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from memlab import assets
from memlab.metrics import sentence_bleu
from memlab.probes import bow, loading, readings, report, synthetic
from memlab.probes.align import fit_align
from memlab.probes.parts import Conditioning, EncoderKind, InputMode
from memlab.probes.sections import BowOptions


def _is_path(spec: str) -> bool:
    return Path(os.path.expanduser(spec)).exists() or spec.startswith((".", "/", "~"))


# encoder kinds: the first whose ``matches`` takes the spec, newest registration first; each loads its own kind
HUB = EncoderKind(lambda s: True, loading.load_transformers, source=loading.hub_source)
FOLDER = EncoderKind(_is_path, loading.load_transformers, source=loading.path_source)
SHORTCUT = EncoderKind(lambda s: s in assets.ASSETS, loading.load_transformers, source=loading.shortcut_source)
SPACE = EncoderKind(lambda s: s.startswith("space:"), loading.load_space)
SYNTHETIC = EncoderKind(lambda s: s.startswith("synthetic:"), synthetic.load_synthetic_kind,
                        known_content=report.check_synthetic_spec)


def pool_last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 1).clamp(min=0)]  # (B, D)


def pool_second_last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 2).clamp(min=0)]  # (B, D)


def pool_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D)


def pool_first(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return h[:, 0]  # (B, D)


def _unrolled_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return x + cond[:, : x.shape[1]]  # (B, T, d): the t-th slice added to the t-th token


def _prefix_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.cat([cond, x], dim=1)  # (B, P + T, d)


UNROLLED = Conditioning(lambda c: c.max_len, _unrolled_join)
PREFIX = Conditioning(lambda c: c.prefix_len, _prefix_join, lambda c: c.prefix_len)


def _teacher(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    if training and config.input_dropout:
        drop = torch.rand(ids.shape, device=ids.device) < config.input_dropout  # (B, T)
        ids = ids.masked_fill(drop, config.start_id)  # (B, T)
    return ids


def _blank(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    return torch.full_like(ids, config.start_id)  # (B, T): all the decoder knows comes through the embedding


TEACHER = InputMode(_teacher)
BLANK = InputMode(_blank, reads_tokens=False)


def bow_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None,
         options: BowOptions = BowOptions()) -> dict:
    fit = context.opts if context is not None else None  # the probe's fit settings (None: the defaults)
    return bow.fit_bow(z_train, train_ids, z_eval, eval_ids, options=options, fit=fit, seed=seed, device=device)


def bow_member(z_train, train_ids, eval_ids, options: BowOptions, fit, device: str = "cpu"):
    return bow.BagHeadMember(z_train, train_ids, eval_ids, options, fit, device)


def bow_summary(b: dict) -> str:
    return (f"bag-of-words read-out: recovered {b['recovered']:.3f} of each chunk's distinct tokens "
            f"(frequency prior {b['prior']:.3f})")


def bow_columns(b: dict) -> dict:
    return {"bow_recovered": b["recovered"], "bow_prior": b["prior"]}


def align_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None) -> dict:
    return fit_align(z_train, z_eval, context)


def align_summary(a: dict) -> str:
    own = (f"; the target's decoder on its own memories {a['own']['recovered']:.3f}, the map predicts "
           f"{a['own']['r2']:.2f} of their variance" if a.get("own") else "")
    return (f"alignment read-out into {a['target']}: token accuracy {a['recovered']:.3f} (prior "
            f"{a['prior']:.3f}{own}), TF1 {a['token_set_f1']:.3f} (prior {a['prior_token_set_f1']:.3f}), {a['bits_per_chunk']:.1f} bits per "
            f"chunk; ridge alpha {a['alpha']:g} by leave-one-out")


def align_columns(a: dict) -> dict:
    return {"align_recovered": a["recovered"], "align_prior": a["prior"], "align_token_set_f1": a["token_set_f1"],
            "align_bits_per_chunk": a["bits_per_chunk"]}


def score_token_set_f1(pred, true, hyps, refs) -> float:
    return readings.token_set_f1(pred, true)


def score_sentence_bleu(pred, true, hyps, refs) -> float:
    return sentence_bleu(hyps, refs) if refs else 0.0


def score_exact_match(pred, true, hyps, refs) -> float:
    return readings.exact_match(pred, true)
