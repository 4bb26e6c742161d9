"""The probe report's typed parts: each reads by attribute and writes exactly report.json's layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memlab.probes.chunks.cut import ProbeText, TextAccounting
from memlab.probes.readings import ChunkScores, DecoderScores, Reading, Reconstructed, cell, retention, shows_retention
from memlab.probes.report.report import Calibration, CalibrationCheck, Fit, ReadoutResult, jsonable
from memlab.probes.sweeps.layers import _row

TEXT = {"chunk_by": "words", "per_chunk": "8 words", "mean_chars": 41.5, "mean_tokens": 9.25, "max_tokens": 12,
        "truncated_chunks": 0, "rendering": "the chunks as their tokens decode",
        "targets": {"tokenizer": "the encoder's", "rendering": "targets"}}


def test_reading_reads_by_attribute_and_as_report_json():
    r = Reading.of({"value": 0.5, "low": -0.1, "high": 0.9})
    assert (r.value, r.low, r.high) == (0.5, -0.1, 0.9) and r["low"] == -0.1 and r.to_dict()["high"] == 0.9
    assert not shows_retention(r) and shows_retention(Reading(0.5, 0.1, 0.9))
    assert cell(r, gain=True) == cell(r.to_dict(), gain=True) == "no evidence [-0.100, 0.900]"
    with pytest.raises(KeyError):
        r["mean"]
    assert retention({"bits_per_chunk": Reading(2.0, 1.0, 3.0)}).startswith("retained: 2 bits per chunk")


def test_calibration_writes_its_checks_with_their_extras_and_a_note_only_when_it_has_one():
    ok = CalibrationCheck("synthetic:constant", "information_gain", 0.0, "its interval holds 0", True,
                          {"interval": [-0.1, 0.1]})
    bad = CalibrationCheck("synthetic:concat", "token_accuracy", 0.4, "token_accuracy >= 0.99", False)
    assert Calibration.verdict([ok]).status == "passed" and Calibration.verdict([ok, bad]).status == "failed"
    assert Calibration.verdict([ok]).to_dict() == {"status": "passed", "checks": [
        {"control": "synthetic:constant", "metric": "information_gain", "value": 0.0,
         "needs": "its interval holds 0", "passed": True, "interval": [-0.1, 0.1]}]}
    assert Calibration.unchecked("not run").to_dict() == {"status": "unchecked", "checks": [], "note": "not run"}


def test_text_accounting_writes_report_json_and_the_probe_text_keeps_its_texts_apart():
    text = TextAccounting(**TEXT)
    assert text.mean_tokens == 9.25 and text.target_rendering == "targets" and text.to_dict() == TEXT
    plain = TextAccounting(**{k: v for k, v in TEXT.items() if k != "targets"})
    assert "targets" not in plain.to_dict() and plain.target_rendering == TEXT["rendering"]
    cut = ProbeText(text, ["a b", "c d"], ["e f"], [3], cap=12)
    assert cut.texts == (["a b", "c d"], ["e f"]) and cut.accounting.to_dict() == TEXT  # texts: never in the report


def _fit(sequence: bool) -> Fit:
    """A fit with a bag-of-words read-out, and a probe and control when ``sequence``."""
    bow = ReadoutResult.split("bow", {"recovered": 0.4, "prior": 0.3, "gain": 0.1, "seconds": 1.0,
                                      "_per_chunk": {"recovered": [0.4], "prior": [0.3]}})
    fit = Fit(readouts={"bow": bow}, readings={"bow_gain": Reading(0.1, 0.05, 0.15)}, retention="retained")
    if sequence:
        teacher = DecoderScores({"ce": 2.0, "token_accuracy": 0.5}, ChunkScores(np.ones(1), np.ones(1), np.ones(1)))
        probe = teacher.with_reconstruction(Reconstructed(
            {"free_running_accuracy": 0.2, "token_set_f1": 0.6, "sentence_bleu": 0.1, "exact_match": 0.0},
            tf1=[0.6], free_hits=[1], texts=["a b"]))
        fit.probe, fit.probe_chunks, fit.control = probe.metrics, probe.chunks, dict(probe.metrics)
        fit.readings["bits_per_chunk"] = Reading(3.0, 2.0, 4.0)
    return fit


def test_decoder_scores_carry_per_chunk_numbers_beside_the_metrics():
    fit = _fit(sequence=True)
    assert not any(k.startswith("_") for k in fit.probe) and fit.probe_chunks.free_hits == [1]
    assert fit.probe_chunks.tf1 == [0.6] and fit.probe["token_set_f1"] == 0.6 and fit.probe["ce"] == 2.0
    assert fit.readouts["bow"].recovered == 0.4 and fit.readouts["bow"].chunks == {"recovered": [0.4], "prior": [0.3]}
    assert jsonable(fit.readouts) == {"bow": {"recovered": 0.4, "prior": 0.3, "gain": 0.1, "seconds": 1.0}}


def test_a_sweep_row_is_typed_and_writes_the_json_row():
    row = _row(_fit(sequence=True))
    assert row.bits == Reading(3.0, 2.0, 4.0) and row.free_running_accuracy == 0.2 and row.control_accuracy == 0.5
    d = row.to_dict()
    assert list(d)[:5] == ["bow_recovered", "bow_prior", "bits_per_chunk", "bits_low", "bits_high"]
    assert d["readings"]["bits_per_chunk"] == {"value": 3.0, "low": 2.0, "high": 4.0} and json.dumps(d)
    assert list(d)[-1] == "seconds" and d["control_free_running_accuracy"] == 0.2
    alone = _row(_fit(sequence=False)).to_dict()
    assert "token_accuracy" not in alone and "bits_per_chunk" not in alone and alone["bow_recovered"] == 0.4
