"""The probe's own parts (see :mod:`memlab.probes.parts`), registered when :mod:`memlab.probes` is imported."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from memlab import assets
from memlab.metrics import sentence_bleu
from memlab.probes import bow, loading, readings, report, synthetic
from memlab.probes.align import check_target, fit_align
from memlab.probes.decoder import ProbeDecoder
from memlab.probes.parts import Conditioning, EncoderKind, InputMode, Part, register_part
from memlab.probes.sections import AlignOptions, BowOptions, LlamaOptions, PrefixOptions, TeacherOptions


def _is_path(spec: str) -> bool:
    return Path(os.path.expanduser(spec)).exists() or spec.startswith((".", "/", "~"))


# encoders: the first whose ``matches`` takes the spec, newest registration first; each loads its own kind
for _name, _kind, _doc, _honours in [
    ("hub", EncoderKind(lambda s: True, loading.load_transformers, source=loading.hub_source),
     "a Hugging Face hub name, read from the local cache", "all"),
    ("folder", EncoderKind(_is_path, loading.load_transformers, source=loading.path_source),
     "a save_pretrained folder, a memlab run directory or a GGUF file", "all"),
    ("shortcut", EncoderKind(lambda s: s in assets.ASSETS, loading.load_transformers, source=loading.shortcut_source),
     "a packaged model (memlab.assets: memlab-lm, minilm, smollm2)", "all"),
    ("space", EncoderKind(lambda s: s.startswith("space:"), loading.load_space),
     "space:NAME[:PATH]: any registered EmbeddingSpace", ("random_init",)),
    ("synthetic", EncoderKind(lambda s: s.startswith("synthetic:"), synthetic.load_synthetic_kind,
                              known_content=report.check_synthetic_spec),
     "synthetic:concat|bag|constant: a calibration encoder", ("random_init",)),
]:  # space and synthetic refuse random_init themselves, in one line that says why
    register_part("encoder", Part(_name, _kind, description=_doc, honours=_honours))


def _last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 1).clamp(min=0)]  # (B, D)


def _second_last(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(h.shape[0], device=h.device)
    return h[rows, (mask.sum(1).long() - 2).clamp(min=0)]  # (B, D)


def _mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D)


def _first(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return h[:, 0]  # (B, D)


for _name, _fn, _doc in [("last", _last, "the last real token's state"),
                         ("second_last", _second_last, "the state before the last token"),
                         ("mean", _mean, "the mean over real tokens"), ("first", _first, "the first position's state")]:
    register_part("pool", Part(_name, _fn, description=_doc))


def _unrolled_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return x + cond[:, : x.shape[1]]  # (B, T, d): the t-th slice added to the t-th token


def _prefix_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.cat([cond, x], dim=1)  # (B, P + T, d)


register_part("conditioning", Part("unrolled", Conditioning(lambda c: c.max_len, _unrolled_join),
                                   description="projected to max_len vectors, one added to each position"))
register_part("conditioning", Part("prefix", Conditioning(lambda c: c.prefix_len, _prefix_join,
                                                          lambda c: c.prefix_len),
                                   options=PrefixOptions, description="projected to prefix_len memory vectors"))


def _teacher(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    if training and config.input_dropout:
        drop = torch.rand(ids.shape, device=ids.device) < config.input_dropout  # (B, T)
        ids = ids.masked_fill(drop, config.start_id)  # (B, T)
    return ids


def _blank(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    return torch.full_like(ids, config.start_id)  # (B, T): all the decoder knows comes through the embedding


register_part("inputs", Part("teacher", InputMode(_teacher), options=TeacherOptions,
                             description="the true previous tokens (greedy generation is autoregressive)"))
register_part("inputs", Part("blank", InputMode(_blank, reads_tokens=False),
                             description="the start token everywhere (a blank copy)"))


register_part("decoder", Part("llama", ProbeDecoder, options=LlamaOptions, honours="all",
                               description="a small Llama-style causal LM trained from scratch (memlab.probes.decoder)"))


def _bow(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None,
         options: BowOptions = BowOptions()) -> dict:
    fit = context.opts if context is not None else None  # the probe's fit settings (None: the defaults)
    return bow.fit_bow(z_train, train_ids, z_eval, eval_ids, options=options, fit=fit, seed=seed, device=device)


def _bow_member(z_train, train_ids, eval_ids, options: BowOptions, fit, device: str = "cpu"):
    return bow.BagHeadMember(z_train, train_ids, eval_ids, options, fit, device)


def _bow_summary(b: dict) -> str:
    return (f"bag-of-words read-out: recovered {b['recovered']:.3f} of each chunk's distinct tokens "
            f"(frequency prior {b['prior']:.3f})")


register_part("readout", Part(
    "bow", _bow, options=BowOptions, summary=_bow_summary, gain_unit="of the bag of words over its prior",
    readings=(("recovered", "bag-of-words read-out", False, 3),
              ("gain", "bag-of-words read-out over its prior", True, 3)),
    columns=lambda b: {"bow_recovered": b["recovered"], "bow_prior": b["prior"]}, member=_bow_member,
    description="bag-of-words read-out: a linear multi-label head, trained in the fit loop"))


def _align(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None) -> dict:
    return fit_align(z_train, z_eval, context)


def _align_summary(a: dict) -> str:
    own = (f"; the target's decoder on its own memories {a['own']['recovered']:.3f}, the map predicts "
           f"{a['own']['r2']:.2f} of their variance" if a.get("own") else "")
    return (f"alignment read-out into {a['target']}: token accuracy {a['recovered']:.3f} (prior "
            f"{a['prior']:.3f}{own}), TF1 {a['token_set_f1']:.3f} (prior {a['prior_token_set_f1']:.3f}), {a['bits_per_chunk']:.1f} bits per "
            f"chunk; ridge alpha {a['alpha']:g} by leave-one-out")


def _align_columns(a: dict) -> dict:
    return {"align_recovered": a["recovered"], "align_prior": a["prior"], "align_token_set_f1": a["token_set_f1"],
            "align_bits_per_chunk": a["bits_per_chunk"]}


register_part("readout", Part("align", _align, options=AlignOptions, check_context=check_target,
                              summary=_align_summary, columns=_align_columns,
                              readings=(("bits_per_chunk", "alignment read-out, bits per chunk over its prior", True, 2),
                                        ("recovered", "alignment read-out, token accuracy in its target", False, 3),
                                        ("gain", "alignment read-out over its prior", True, 3),
                                        ("token_set_f1", "alignment read-out, TF1", False, 3),
                                        ("token_set_f1_gain", "alignment read-out, TF1 over its prior", True, 3)),
                              description="alignment read-out: a ridge map into align_target's space, read by its "
                                          "own decoder"))


def _token_set_f1(pred, true, hyps, refs) -> float:
    return readings.token_set_f1(pred, true)


def _sentence_bleu(pred, true, hyps, refs) -> float:
    return sentence_bleu(hyps, refs) if refs else 0.0


def _exact_match(pred, true, hyps, refs) -> float:
    return readings.exact_match(pred, true)


for _name, _fn, _doc in [("token_set_f1", _token_set_f1, "F1 of the token sets of reconstruction and chunk"),
                         ("sentence_bleu", _sentence_bleu, "NLTK sentence BLEU of the decoded reconstruction"),
                         ("exact_match", _exact_match, "share of chunks rebuilt token for token")]:
    register_part("scorer", Part(_name, _fn, description=_doc))
