"""What the fits take and give, as typed records: the data (``FitData``), the control store and its entries, a fitted
decoder (``Fitted``), a control's run and the whole fit (``DecoderFit``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
import torch

from memlab.probes.readings import DecoderScores


@dataclass(frozen=True)
class FitData:
    """What one fit reads: the targets' tokenizer, the training and held-out target ids (N, T), (M, T), the
    embeddings (N, D), (M, D) and the token table of the targets, if any."""

    tok: Any
    train_ids: torch.Tensor
    eval_ids: torch.Tensor
    z_train: torch.Tensor
    z_eval: torch.Tensor
    table: torch.Tensor | None = None
    """The token table the decoders' output layer maps (:mod:`memlab.probes.decoder.table`), or None."""

    def constant(self) -> "FitData":
        """The same chunks read from a constant embedding (the mean training embedding): the control's data."""
        mean = self.z_train.mean(0, keepdim=True)  # (1, D)
        return replace(self, z_train=mean.expand_as(self.z_train), z_eval=mean.expand_as(self.z_eval))


@dataclass
class ControlStore:
    """Where a probe's control is looked up and kept: ``cache`` (a dict shared by probes, or a
    :class:`~memlab.probes.decoder.control_cache.ControlCache`; None: kept nowhere) under ``key``, trained by ``owner``."""

    cache: Any = None
    key: str | None = None
    owner: str | None = None

    def get(self) -> "ControlEntry | None":
        return self.cache[self.key] if self.cache is not None and self.key in self.cache else None

    def put(self, entry: "ControlEntry") -> None:
        if self.cache is not None:
            self.cache[self.key] = entry


@dataclass
class ControlEntry:
    """A trained control, as the control cache keeps it: the control a probe is read against (``control``, its
    second run, started as the first and trained as the contained probe is), its held-out ``scores`` and its
    ``history`` (both runs); the first run (``start``: where the contained probe starts), its scores (None until a
    kept scratch probe reads them) and history; and ``owner``, the probe that trained it."""

    scores: DecoderScores
    history: list
    owner: str | None
    control: Any
    start: Any
    first_scores: DecoderScores | None
    first_history: list


@dataclass
class Fitted:
    """A fitted decoder: the decoder, its held-out scores, its history and its training seconds."""

    decoder: Any
    scores: DecoderScores
    history: list
    seconds: float


@dataclass
class ControlRun:
    """The control a probe is read against: its held-out scores, history and seconds (0 when cached), and the
    probe that trained it (None: this one)."""

    scores: DecoderScores | None
    history: list
    seconds: float
    shared_with: str | None = None


@dataclass
class DecoderFit:
    """What :func:`fit_decoders` gives: the kept probe decoder and the control it is read against (None: none)."""

    probe: Fitted
    control: ControlRun | None = None


@dataclass(frozen=True)
class Loop:
    """How a group is trained: its progress line, whether batched (None: the machine's choice), and the read-out
    members trained in the probe's group (:func:`memlab.probes.decoder.fitloop.train_members`)."""

    desc: str = "probe decoder"
    batched: bool | None = None
    readouts: tuple = ()
