"""Synthetic calibration encoders: embeddings whose information content is known by construction.

``memlab probe --model synthetic:NAME[:TOKENIZER_DIR]`` probes one like any model:

* ``concat``: each token id has a fixed random code (``code_dim`` = 32
  Gaussian numbers scaled to unit length, seeded: wide enough that a linear
  read-out tells 4096 codes apart); the chunk's embedding is the concatenation of its tokens'
  codes, position by position (zero-padded to ``max_len`` positions). Fully
  invertible: a working probe rebuilds every token.
* ``bag``: the mean of the tokens' codes (``bag_dim`` numbers each). The set
  of tokens is kept (random codes in a wide space are nearly orthogonal), their
  order is lost: a working probe rebuilds the set, not the positions.
* ``constant``: the same vector for every chunk. Nothing is kept: the probe
  must score as its control (information gain 0).

They read a real tokenizer: by default the BPE tokenizer shipped with
memlab's small causal LM (``memlab/resources/checkpoints/token_lm-toy``, 4096
tokens), or the tokenizer saved in ``TOKENIZER_DIR``; so the whole probe
pipeline (corpus chunks, compact vocabulary, report) runs as for a real model.

The report's calibration section (:func:`calibration`) comes from them: does the probe read what is there? A probe
of a synthetic encoder is checked against what it must read (:data:`EXPECT`; with the alignment read-out also
:func:`check_align`). With ``calibrate=True`` a probe of any model also fits the same decoder on ``synthetic:concat``
codes and the bag-of-words read-out on ``synthetic:bag`` codes of the same chunks in the model's own tokenizer
(:func:`calibrate_on`): when these positive controls fail, the report says that the probe could not see, not that
the model forgot (``report["calibration"]``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.data.tokenizer import load_tokenizer
from memlab.errors import ModelError
from memlab.paths import resource
from memlab.probes.chunks.batch import fill_pad, mask_of
from memlab.probes.parts import encoder_kind, fit_readout, resolve
from memlab.probes.kinds import EncoderKind
from memlab.probes.report.report import Calibration, CalibrationCheck, Fit, ReadoutResult
from memlab.probes.decoder.fit import fit_selected
from memlab.probes.decoder.records import FitData

KINDS = ("concat", "bag", "constant")
DEFAULT_TOKENIZER = resource("checkpoints", "token_lm-toy")


class SyntheticEncoder:
    """A calibration encoder (see the module doc): ``(B, T)`` ids -> ``(B, D)`` float32."""

    pool = "synthetic"
    layer = None
    resizable = True
    """Built for any chunk length: the probe rebuilds it (:meth:`resized`) for its longest chunk."""

    def __init__(self, kind: str, tokenizer, max_len: int = 64, code_dim: int = 32, bag_dim: int = 512,
                 seed: int = 0):
        if kind not in KINDS:
            raise ModelError(f"unknown synthetic encoder '{kind}'; use synthetic:{', synthetic:'.join(KINDS)}")
        self.kind = kind
        self.seed = seed
        self.tokenizer = tokenizer
        self.name = f"synthetic:{kind}"
        self.max_length = int(max_len)
        self.code_dim = int(code_dim if kind == "concat" else bag_dim)
        gen = torch.Generator().manual_seed(seed)
        v = len(tokenizer)
        codes = torch.randn(v, self.code_dim, generator=gen)  # (V, c): one fixed random code per token id
        self.codes = codes / codes.norm(dim=1, keepdim=True)  # unit length: every code is as loud as any other
        self.dim = self.max_length * self.code_dim if kind == "concat" else (8 if kind == "constant" else self.code_dim)

    def resized(self, max_len: int) -> "SyntheticEncoder":
        """The same codes for chunks of up to ``max_len`` tokens."""
        return SyntheticEncoder(self.kind, self.tokenizer, max_len=max_len, code_dim=self.code_dim,
                                bag_dim=self.code_dim, seed=self.seed)

    def describe(self) -> dict:
        return {"name": self.name, "pool": self.pool, "dim": self.dim, "layer": None, "code_dim": self.code_dim,
                "max_len": self.max_length}

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        if t > self.max_length:
            raise ModelError(f"{self.name} was built for at most {self.max_length} tokens, got {t}")
        if self.kind == "constant":
            return torch.ones(b, self.dim)  # (B, 8): the same for every chunk
        m = attention_mask.float().unsqueeze(-1)  # (B, T, 1)
        codes = self.codes[input_ids.clamp(0, self.codes.shape[0] - 1)] * m  # (B, T, c)
        if self.kind == "bag":
            return codes.sum(1) / m.sum(1).clamp(min=1.0)  # (B, c)
        out = torch.zeros(b, self.max_length, self.code_dim)  # (B, max_len, c)
        out[:, :t] = codes
        return out.flatten(1)  # (B, max_len * c)

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])


def load_synthetic_kind(spec: str, random_init: bool = False, max_len: int | None = None, **_) -> SyntheticEncoder:
    """The ``synthetic:`` encoder kind: :func:`load_synthetic`, for chunks of up to ``max_len`` tokens (default
    64); the other encoder options do not apply to it."""
    if random_init:
        raise ModelError("random_init applies to transformers models, not to synthetic encoders")
    return load_synthetic(spec, max_len=max_len or 64)


def load_synthetic(spec: str, max_len: int = 64) -> SyntheticEncoder:
    """``synthetic:KIND[:TOKENIZER_DIR]`` -> a :class:`SyntheticEncoder`."""

    _, _, rest = spec.partition(":")
    kind, _, folder = rest.partition(":")
    if kind not in KINDS:
        raise ModelError(f"unknown synthetic encoder '{kind}'; use synthetic:{', synthetic:'.join(KINDS)}")
    folder = folder or str(DEFAULT_TOKENIZER)
    if not Path(folder).is_dir():
        raise ModelError(f"{spec}: tokenizer folder '{folder}' does not exist")
    tok = load_tokenizer(folder)
    return SyntheticEncoder(kind, tok, max_len=max_len)


KIND = EncoderKind("synthetic:", load_synthetic_kind,
                   known_content="memlab.probes.encoders.synthetic:check_synthetic_spec")
"""The ``synthetic:`` encoder kind (registered in :mod:`memlab.probes.catalog`)."""


# Calibration: what a working probe reads from each synthetic encoder, and the report's positive controls.

EXPECT = {"concat": ("token_accuracy", 0.99), "bag": ("bow_token_set_f1", 0.9), "constant": ("information_gain", 0.01)}
"""What a working probe reads from each synthetic encoder: (metric, threshold). For ``bag`` the set is read by the
bag-of-words read-out: its top-k at the chunk's own k is a token-set F1 (precision = recall there); a decoder
that emits every position at once cannot spread an order-free set over positions (it repeats the likeliest
token), so its TF1 is reported but not the test."""


def _check(control: str, metric: str, value, passed: bool, needs: str, **extra) -> CalibrationCheck:
    return CalibrationCheck(control, metric, value, needs, passed, extra)


_verdict = Calibration.verdict


ALIGN_SLACK = 0.05
"""The alignment read-out's positive control: of a synthetic encoder that keeps every token (``concat``) it reads at
least its target's own reading of the same chunks less this much (the map loses no more); of ``constant`` its gain's
interval holds 0."""


def check_align(kind: str, fit: Fit) -> list[CalibrationCheck]:
    """The alignment read-out's checks on a synthetic encoder (:data:`ALIGN_SLACK`); none when it was not fitted."""
    a = fit.readouts.get("align")
    if not a or kind == "bag":  # a bag keeps no order: what a target that reads sequences makes of it is not known
        return []
    name = f"synthetic:{kind} (align read-out into {a.values.get('target', 'its target')})"
    if kind == "constant":
        r = fit.readings.get("align_gain")
        if r is None:
            return []
        return [_check(name, "align gain", r.value, r.low <= 0.0 <= r.high, "its interval holds 0",
                       interval=[r.low, r.high])]
    own = (a.values.get("own") or {}).get("recovered")
    if own is None:
        return []
    return [_check(name, "recovered", a.recovered, a.recovered >= own - ALIGN_SLACK,
                   f"recovered >= its target's own {own:.3f} - {ALIGN_SLACK}", own=own,
                   r2=a.values["own"].get("r2"))]


def check_synthetic_spec(spec: str, fit: Fit) -> Calibration:
    """:func:`check_synthetic` of the encoder ``synthetic:KIND[:TOKENIZER_DIR]`` (the synthetic kind's
    ``known_content``)."""
    return check_synthetic(spec.split(":")[1], fit)


def check_synthetic(kind: str, fit: Fit) -> Calibration:
    """Calibration of a synthetic encoder's own probe: its metric against its threshold (:data:`EXPECT`), and the
    alignment read-out's checks when it was fitted (:func:`check_align`)."""
    got = _check_synthetic(kind, fit)
    extra = check_align(kind, fit)
    if not extra:
        return got
    if got.status == "unchecked":
        return _verdict(extra, note=got.note)
    return _verdict(got.checks + extra)


def _check_synthetic(kind: str, fit: Fit) -> Calibration:
    metric, thr = EXPECT[kind]
    name, bow = f"synthetic:{kind}", fit.readouts.get("bow")
    if metric == "bow_token_set_f1" and bow:
        value = bow.recovered
        return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])
    missing = ("the bag-of-words read-out (readouts=[bow, ...])" if metric == "bow_token_set_f1" and not bow else
               "the control (control=true)" if metric == "information_gain" and fit.probe is not None
               and fit.information_gain is None else None)
    if missing or (fit.probe is None and not bow):
        fits = missing or ("the sequence probe (sequence=true) or the bag-of-words read-out" if kind == "concat"
                           else "the bag-of-words read-out")
        return Calibration.unchecked(f"{name} is checked by {fits}, which this probe did not fit")
    if fit.probe is None:  # no sequence probe (a BoW-only sweep): the read-out's share or gain
        if kind == "constant":
            value = bow.gain
            return _verdict([_check(name, "bow gain", value, abs(value) <= thr, f"bow gain |x| <= {thr}")])
        value, thr = bow.recovered, EXPECT["bag"][1]
        return _verdict([_check(name, "bow recovered", value, value >= thr, f"bow recovered >= {thr}")])
    if metric == "information_gain":
        value, r = fit.information_gain, fit.readings.get("information_gain")
        if r is not None:  # nothing is there to read: the interval must hold 0
            return _verdict([_check(name, metric, value, r.low <= 0.0 <= r.high,
                                    "its interval holds 0", interval=[r.low, r.high])])
        return _verdict([_check(name, metric, value, value is not None and abs(value) <= thr,
                                f"|information gain| <= {thr}")])
    value = fit.probe[metric]
    return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])


def _codes(kind: str, tok, ids: torch.Tensor) -> torch.Tensor:
    """Synthetic ``kind`` embeddings (N, D) of chunks ``ids`` (N, T) in their own tokenizer."""
    return SyntheticEncoder(kind, tok, max_len=ids.shape[1]).encode(fill_pad(ids), mask_of(ids).long())


def calibrate_on(opts, tok, train_ids, eval_ids) -> Calibration:
    """Positive controls in the model's tokenizer on the same chunks: concat (sequence decoder), bag (BoW)."""
    got = fit_selected(opts, FitData(tok, train_ids, eval_ids, _codes("concat", tok, train_ids),
                                     _codes("concat", tok, eval_ids)), desc="calibration decoder")
    m, secs = got.scores, got.seconds
    b = ReadoutResult.split("bow", fit_readout(train_ids, eval_ids, _codes("bag", tok, train_ids),
                                               _codes("bag", tok, eval_ids), "bow", seed=opts.seed, device=opts.device))
    (m_concat, t_concat), t_bag = EXPECT["concat"], EXPECT["bag"][1]
    return _verdict([
        _check("synthetic:concat", m_concat, m[m_concat], m[m_concat] >= t_concat, f"{m_concat} >= {t_concat}",
               seconds=secs),
        _check("synthetic:bag (bag-of-words read-out)", "recovered", b.recovered, b.recovered >= t_bag,
               f"recovered >= {t_bag}", seconds=b.seconds),
    ])


def calibration(opts, tok, train_ids, eval_ids, fit: Fit) -> Calibration:
    """The report's calibration section (see the module doc)."""
    kind = encoder_kind(opts.model)
    if kind is not None and kind.impl.known_content is not None:  # an encoder of known content checks itself
        return resolve(kind.impl.known_content)(opts.model, fit)
    if opts.calibrate and fit.probe:
        return calibrate_on(opts, tok, train_ids, eval_ids)
    return Calibration.unchecked("positive controls not run on these chunks (calibrate=true, or the quickstart's "
                                 "calibration rows)")
