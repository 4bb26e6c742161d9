"""The probe's own parts (see :mod:`memlab.probes.parts`), registered when :mod:`memlab.probes` is imported."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from memlab.probes.parts import Conditioning, EncoderKind, Part, register_part
from memlab.probes.sections import AlignOptions, BowOptions, LlamaOptions, PrefixOptions, TeacherOptions


def _load_encoder(spec: str, **kw):
    from memlab.probes.loading import load_encoder

    return load_encoder(spec, **kw)


def _is_path(spec: str) -> bool:
    return Path(os.path.expanduser(spec)).exists() or spec.startswith((".", "/", "~"))


def _is_shortcut(spec: str) -> bool:
    from memlab import assets

    return spec in assets.ASSETS


# encoders: the spec forms memlab.probes.loading resolves (the first that matches, newest registration first)
for _name, _match, _doc in [
    ("hub", lambda s: True, "a Hugging Face hub name, read from the local cache"),
    ("folder", _is_path, "a save_pretrained folder, a memlab run directory or a GGUF file"),
    ("shortcut", _is_shortcut, "a packaged model (memlab.assets: memlab-lm, minilm, smollm2)"),
    ("space", lambda s: s.startswith("space:"), "space:NAME[:PATH]: any registered EmbeddingSpace"),
    ("synthetic", lambda s: s.startswith("synthetic:"), "synthetic:concat|bag|constant: a calibration encoder"),
]:
    register_part("encoder", Part(_name, EncoderKind(_match, _load_encoder), description=_doc))


def _pool(name: str):
    def pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        from memlab.probes.capture import pool_states

        return pool_states(h, mask, name)  # (B, T, D) -> (B, D)

    return pool


for _name, _doc in [("last", "the last real token's state"), ("second_last", "the state before the last token"),
                    ("mean", "the mean over real tokens"), ("first", "the first position's state")]:
    register_part("pool", Part(_name, _pool(_name), description=_doc))


def _unrolled_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return x + cond[:, : x.shape[1]]  # (B, T, d): the t-th slice added to the t-th token


def _prefix_join(x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    return torch.cat([cond, x], dim=1)  # (B, P + T, d)


register_part("conditioning", Part("unrolled", Conditioning(lambda c: c.max_len, _unrolled_join),
                                   description="projected to max_len vectors, one added to each position"))
register_part("conditioning", Part("prefix", Conditioning(lambda c: c.prefix_len, _prefix_join,
                                                          lambda c: c.prefix_len),
                                   options_class=PrefixOptions, description="projected to prefix_len memory vectors"))


def _teacher(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    if training and config.input_dropout:
        drop = torch.rand(ids.shape, device=ids.device) < config.input_dropout  # (B, T)
        ids = ids.masked_fill(drop, config.start_id)  # (B, T)
    return ids


def _blank(ids: torch.Tensor, config, training: bool) -> torch.Tensor:
    return torch.full_like(ids, config.start_id)  # (B, T): all the decoder knows comes through the embedding


register_part("inputs", Part("teacher", _teacher, options_class=TeacherOptions,
                             description="the true previous tokens (greedy generation is autoregressive)"))
register_part("inputs", Part("blank", _blank, description="the start token everywhere (a blank copy)"))


def _llama(config):
    from memlab.probes.decoder import ProbeDecoder

    return ProbeDecoder(config)


register_part("decoder", Part("llama", _llama, options_class=LlamaOptions,
                               description="a small Llama-style causal LM trained from scratch (memlab.probes.decoder)"))


def _bow(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu",
         options: BowOptions = BowOptions()) -> dict:
    from memlab.probes.bow import fit_bow

    return fit_bow(z_train, train_ids, z_eval, eval_ids, epochs=options.bow_epochs, lr=options.bow_lr,
                   weight_decay=options.bow_weight_decay, batch_size=options.bow_batch_size,
                   val_fraction=options.bow_val_fraction, patience=options.bow_patience, seed=seed, device=device)


register_part("readout", Part("bow", _bow, options_class=BowOptions, description="bag-of-words read-out: a linear multi-label head"))


def _align(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None) -> dict:
    from memlab.probes.align import fit_align

    return fit_align(z_train, z_eval, context)


def _align_check(context) -> None:
    from memlab.probes.align import check_target

    check_target(context)


register_part("readout", Part("align", _align, options_class=AlignOptions, check_context=_align_check,
                              description="alignment read-out: a ridge map into align_target's space, read by its "
                                          "own decoder"))


def _scorer(name: str):
    def score(pred, true, hyps, refs) -> float:
        from memlab.probes import scores

        if name == "sentence_bleu":
            from memlab.metrics import sentence_bleu

            return sentence_bleu(hyps, refs) if refs else 0.0
        return getattr(scores, name)(pred, true)

    return score


for _name, _doc in [("token_set_f1", "F1 of the token sets of reconstruction and chunk"),
                    ("sentence_bleu", "NLTK sentence BLEU of the decoded reconstruction"),
                    ("exact_match", "share of chunks rebuilt token for token")]:
    register_part("scorer", Part(_name, _scorer(_name), description=_doc))
