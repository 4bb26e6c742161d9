"""The decoder's output layer as a learned map of the encoder's own token table (``token_table``).

A scratch decoder learns one output vector per kept token, and a token seen a few times in the training chunks
gets a vector it can hardly learn. Most encoders carry a table that already places every token: their input
embeddings (a transformers model's ``get_input_embeddings()``, a memlab space's ``input_embeddings()``). With
``token_table=auto`` the decoder's output vector of token ``v`` is ``W t_v + r_v`` (``t_v``: the table's row of
``v``, standardised per dimension; ``W``: a learned map from the table's width to the decoder's; ``r_v``: a learned
vector of its own, started at zero), and a learned bias per token: every token starts where the encoder put it, one
map is learned for all of them at first, and a token seen often enough moves on by its own vector. Measured on the
memory autoencoder (docs/results/probes.md) it lowers the held-back loss of the first epochs by a third and more
but stops no lower than a scratch layer, so the default is ``none``.

The table is a fact of the encoder, not of a chunk: the control (the same decoder on a constant embedding) reads
the same table, so the reading's gain over the control is still what the embedding adds. The control's key names the
table (:func:`table_key`): probes of encoders with other tables do not share a control.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch
from torch import nn

from memlab.errors import ConfigError
from memlab.probes.sections import TOKEN_TABLES


class TableHead(nn.Module):
    """The output layer ``(.., d) -> (.., C)`` whose class vectors are ``map(table) + own``: ``table`` (C, D_t) a
    buffer (the kept tokens' rows and the *other* class's, set by :meth:`set_table`), ``map`` a linear map D_t -> d,
    ``own`` (C, d) each class's own vector (zero at the start), ``bias`` (C,)."""

    def __init__(self, hidden_size: int, n_classes: int, table_dim: int):
        super().__init__()
        self.map = nn.Linear(table_dim, hidden_size, bias=False)
        self.own = nn.Parameter(torch.zeros(n_classes, hidden_size))
        self.bias = nn.Parameter(torch.zeros(n_classes))
        self.register_buffer("table", torch.zeros(n_classes, table_dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        w = self.map(self.table.to(self.map.weight.dtype)) + self.own  # (C, d)
        return nn.functional.linear(h, w.to(h.dtype), self.bias.to(h.dtype))

    @torch.no_grad()
    def set_table(self, full: torch.Tensor, kept_ids: list[int], has_other: bool) -> None:
        """Rows of the full table ``full`` (V, D_t) for the kept ids, and for the *other* class the mean of the rows
        not kept; standardised per dimension over the kept rows and scaled by ``1 / sqrt(D_t)`` so that a class
        vector starts at the scale of a scratch decoder's (weights drawn at 0.02)."""
        full = full.detach().float().cpu()
        kept = torch.as_tensor(kept_ids, dtype=torch.long)
        inside = kept < full.shape[0]  # an id past the table (a token added to the tokenizer): the table's mean
        rows = torch.where(inside[:, None], full[kept.clamp_max(full.shape[0] - 1)], full.mean(0))  # (K, D_t)
        kept = kept[inside]
        if has_other:
            rest = torch.ones(full.shape[0], dtype=torch.bool)
            rest[kept] = False
            other = full[rest].mean(0, keepdim=True) if rest.any() else rows.mean(0, keepdim=True)
            rows = torch.cat([rows, other])
        mean, std = rows.mean(0), rows.std(0).clamp_min(1e-6)
        self.table.copy_(((rows - mean) / std / rows.shape[1] ** 0.5).to(self.table.device))


def with_table(opts, encoder, targets):
    """``targets`` (:class:`~memlab.probes.chunks.targets.Targets`) with the token table its decoder reads
    (:func:`decoder_table`; the encoder's when the targets are in its tokenizer)."""
    return replace(targets, table=decoder_table(opts, encoder, targets.tokenizer is encoder.tokenizer))


def decoder_table(opts, encoder, own_targets: bool) -> torch.Tensor | None:
    """The token table of a probe's decoder (:func:`encoder_table` of its ``token_table``), or None where the chosen
    decoder part has no such option (a pretrained decoder has its own output layer)."""
    from memlab.probes.parts import get_part

    if "token_table" not in get_part("decoder", opts.decoder).option_names:
        return None
    return encoder_table(opts.token_table, encoder, own_targets)


def encoder_table(choice: str, encoder, own_targets: bool) -> torch.Tensor | None:
    """The token table a decoder reads under ``token_table=choice``: the encoder's input embeddings (V, D_t) when
    it has them and the decoder's targets are in its tokenizer (``own_targets``), else None; ``encoder`` refused
    where there is none."""
    if choice not in TOKEN_TABLES:
        raise ConfigError(f"'token_table' must be one of {', '.join(TOKEN_TABLES)}, got {choice!r}")
    if choice == "none":
        return None
    table = tokens_of(encoder) if own_targets else None
    if table is None and choice == "encoder":
        why = ("the targets are in another tokenizer (target_tokenizer)" if not own_targets else
               f"{getattr(encoder, 'name', 'the encoder')} has no token embedding table")
        raise ConfigError(f"token_table=encoder: {why}; use token_table=auto or none")
    return table


def tokens_of(encoder) -> torch.Tensor | None:
    """The encoder's token embedding table ``(V, D_t)`` on the CPU, or None (a synthetic encoder, a space without
    one)."""
    get = getattr(encoder, "token_table", None)
    table = get() if callable(get) else None
    if table is None or table.is_meta:  # none, or weights placed on the meta device (offloaded)
        return None
    table = table.detach().float().cpu()
    return table if table.dim() == 2 else None  # ids past its rows read its mean (TableHead.set_table)


def table_key(table: torch.Tensor | None) -> str | None:
    """A short digest of ``table`` (None without one): what a shared control is keyed by besides the chunks."""
    if table is None:
        return None
    return hashlib.sha256(table.numpy().tobytes()).hexdigest()[:16]
