"""Calibration: does the probe read what is there? Positive controls of known content.

A probe of a synthetic encoder (:mod:`memlab.probes.synthetic`) is checked against what it must read
(``concat``: token accuracy >= 0.99; ``bag``: token-set F1 of the bag-of-words read-out >= 0.9;
``constant``: the interval of its information gain holds 0; with the alignment read-out also
:func:`check_align`). With ``calibrate=True`` a probe of any model also fits the same decoder on
``synthetic:concat`` codes and the bag-of-words read-out on ``synthetic:bag`` codes of the same chunks in the
model's own tokenizer: when these positive controls fail, the report says that the probe could not see, not that
the model forgot (``report["calibration"]``).
"""

from __future__ import annotations

import torch

from memlab.probes.chunks import fill_pad, mask_of
from memlab.probes.parts import encoder_kind, fit_readout
from memlab.probes.result import Calibration, CalibrationCheck, Fit, ReadoutResult
from memlab.probes.synthetic import SyntheticEncoder
from memlab.probes.train import fit_selected


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
    _, m, _, secs = fit_selected(opts, tok, train_ids, eval_ids, _codes("concat", tok, train_ids),
                                 _codes("concat", tok, eval_ids), desc="calibration decoder")
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
        return kind.impl.known_content(opts.model, fit)
    if opts.calibrate and fit.probe:
        return calibrate_on(opts, tok, train_ids, eval_ids)
    return Calibration.unchecked("positive controls not run on these chunks (calibrate=true, or the quickstart's "
                                 "calibration rows)")
