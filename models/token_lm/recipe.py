"""Recipe ``lm``: next-token training of a causal LM on fixed token chunks."""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.data.stream import stream_corpus
from memlab.data.views import ChunkDataset
from memlab.flops import matrix_params, transformer_train_flops
from memlab.loading import check_fits_tokenizer, config_for_tokenizer
from memlab.losses import linear_cross_entropy, logits_cross_entropy
from memlab.registry import FAMILIES, RECIPES
from memlab.train.setup import StepOutput, TrainSetup


def _head_features(model):
    """``(base model, head)`` when the logits are exactly ``head(base(...).last_hidden_state)`` (a Linear head,
    no soft-capping or logit scaling), else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    cfg = getattr(model, "config", None)
    plain = cfg is not None and not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) is None
    return (base, head) if isinstance(head, torch.nn.Linear) and isinstance(base, torch.nn.Module) and plain else None


def causal_lm_step(model, batch: dict) -> StepOutput:
    """Next-token cross-entropy and token accuracy on a batch of chunks (no padding in chunks); the head and
    the loss run block by block (:func:`memlab.losses.linear_cross_entropy`) where the model allows it."""
    ids = batch["input_ids"]  # (B, T)
    target = ids[:, 1:]  # (B, T-1)
    parts = _head_features(model)
    if parts is not None:
        base, head = parts
        hidden = base(input_ids=ids).last_hidden_state[:, :-1]  # (B, T-1, d)
        total, correct, n = linear_cross_entropy(hidden, head.weight, target, bias=head.bias)
    else:
        total, correct, n = logits_cross_entropy(model(input_ids=ids).logits[:, :-1], target)  # (B, T-1, V) logits
    return StepOutput(loss=total / n, metrics={"token_accuracy": correct / n}, weight=float(target.numel()))


def build_model_for_tokenizer(cfg, tokenizer, seq_len: int):
    """Build the configured family with the tokenizer's vocabulary and special ids
    (or load ``model.init_from``, whose saved tokenizer the recipe must use)."""
    family = FAMILIES.get(cfg.model.family)
    if cfg.model.init_from:
        from memlab.loading import load_pretrained

        model = load_pretrained(cfg.model.init_from, family.model_class)
        check_fits_tokenizer(model.config, tokenizer, seq_len)
        return model
    return family.model_class(config_for_tokenizer(family, cfg.model.preset, cfg.model.overrides, tokenizer, seq_len))


class LMRecipe:
    """Next-token prediction on token chunks (token-level LM baseline)."""

    name = "lm"
    options_class = None

    def setup(self, cfg, run_dir: Path, env=None) -> TrainSetup:
        init = cfg.model.init_from
        from memlab.loading import resolve_model_dir

        corpus = stream_corpus(cfg.data, Path(run_dir) / "tokenizer",
                               tokenizer_spec=str(resolve_model_dir(init)) if init else None)  # read lazily
        tok = corpus.tokenizer
        model = build_model_for_tokenizer(cfg, tok, cfg.data.seq_len)  # checks seq_len against the model first
        train = corpus.chunks("train", cfg.data.seq_len)  # (N, T) memory-mapped
        val = corpus.chunks("validation", cfg.data.seq_len)  # (N', T) or None
        c = model.config
        flops = transformer_train_flops(matrix_params(model), c.num_hidden_layers, c.hidden_size, cfg.data.seq_len)
        return TrainSetup(
            model=model,
            train_data=ChunkDataset(train),
            eval_data=ChunkDataset(val) if val is not None else None,
            loss_fn=causal_lm_step,
            tokenizer=tok,
            tokens_per_example=cfg.data.seq_len,
            flops_per_example=flops,
            summary={"train_chunks": int(train.shape[0]), "eval_chunks": int(val.shape[0]) if val is not None else 0,
                     "vocab_size": len(tok)},
        )


RECIPES.register("lm", LMRecipe(), description=LMRecipe.__doc__)
