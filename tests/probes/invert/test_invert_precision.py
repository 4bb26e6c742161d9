"""States read at a lower precision (``memlab invert --states-dtype``): the copy and its noise floor, ``ambiguous``
where two candidates lie within that floor (never ``match``), float32 as the search always was, the option's
refusals, and a resume that checks and keeps the new kind."""

from __future__ import annotations

import json

import pytest
import torch

from memlab.errors import ModelError
from memlab.probes.invert.layer import LayerReader
from memlab.probes.invert.positions.lockstep import Lockstep
from memlab.probes.invert.positions.precision import DTYPES, measured_error, noise_floor, read_as
from memlab.probes.invert.positions.searcher import Searcher
from test_invert import FAST, V, tiny
from test_invert_trust import _cut


def _states(seed: int = 0) -> torch.Tensor:
    """Rows like a model's states: mostly small, one outlier coordinate, one row the attention sink's size."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 48, generator=g)  # (6, 48)
    x[:, 5] *= 30
    x[0] *= 200
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_copy_lies_within_its_noise_floor_and_reads_back_as_itself(dtype):
    x = _states()
    read = read_as(x, dtype)
    floor = noise_floor(read, dtype)
    assert read.shape == x.shape and floor.shape == (6,)
    assert bool((measured_error(x, read) <= floor * (1 + 1e-5) + 1e-12).all())  # the floor bounds the copy's error
    assert torch.equal(read_as(read, dtype), read)  # a copy read at its own precision is itself
    if dtype == "float32":
        assert read is x and not floor.any()
    else:
        assert bool((floor > 0).all()) and bool((measured_error(x, read) > 0).any())


@pytest.mark.parametrize("dtype, levels", [("int8", 127), ("int4", 7)])
def test_an_integer_copy_has_its_levels_and_one_scale_per_vector(dtype, levels):
    x = _states()
    read = read_as(x, dtype)
    scale = x.abs().amax(-1, keepdim=True) / levels  # (6, 1)
    q = read / scale
    assert torch.allclose(q, q.round(), atol=1e-4) and int(q.round().abs().max()) == levels
    assert torch.equal(read_as(torch.zeros(2, 8), dtype), torch.zeros(2, 8))  # a zero state stays zero


def test_float16_refuses_states_it_cannot_hold():
    with pytest.raises(ModelError, match="does not fit|do not fit"):
        read_as(torch.tensor([[1.0, 7e4]]), "float16")
    assert torch.isfinite(read_as(torch.tensor([[1.0, 7e4]]), "bfloat16")).all()


def _near_twin(seed: int = 0):
    """A tiny llama whose tokens 7 and 8 have embedding rows 1e-3 apart (their states too, well above float noise
    and well below int4's floor), and a sequence that reads token 7 at the first and at a later position."""
    model = tiny("llama", seed)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        emb[8] = emb[7] + 1e-3 * emb[7].norm() * torch.randn(emb.shape[1], generator=g) / emb.shape[1] ** 0.5
    reader = LayerReader(model, 2)
    seq = [7, 40, 91, 7, 150]
    states = reader.full_states(torch.tensor([seq]))[0]  # (5, D)
    return reader, seq, states


def _search(reader, states: torch.Tensor, dtype: str):
    read = read_as(states, dtype)
    floors = noise_floor(read, dtype)
    s = Searcher(reader, FAST)
    first = s.first_positions([], read[:1], floors=floors[:1])[0]
    return s.chunk(read, [], first=first, floors=floors), floors


def test_two_candidates_within_int4s_noise_are_ambiguous_never_match():
    reader, seq, states = _near_twin()
    exact, _ = _search(reader, states, "float32")
    assert [p.token for p in exact] == seq and all(p.certificate == "match" for p in exact)  # float32 tells 7 from 8
    assert all(p.noise == 0 for p in exact)
    got, floors = _search(reader, states, "int4")
    assert bool((floors > 1e-2).all())
    for t in (0, 3):  # the table's first position and a searched one: 7 and 8 lie within the floor of each other
        p = got[t]
        assert p.token in (7, 8) and p.certificate == "ambiguous", (t, p)
        assert p.runner_up - p.distance <= p.noise and p.noise == pytest.approx(float(floors[t]))
    wrong = [p for p, t in zip(got, seq) if p.token != t]
    assert not any(p.certificate == "match" for p in wrong)  # a wrong token is never certified match


def test_the_lockstep_search_gives_ambiguous_too():
    reader, seq, states = _near_twin()
    read = read_as(states, "int4")
    floors = noise_floor(read, "int4")
    search = Lockstep(reader, FAST)
    firsts = search.first.first_positions([], read[:1], floors=floors[:1])
    got = search.group([read], [], [seq], firsts, floors=[floors])[0]
    assert got[0].certificate == "ambiguous" and got[3].certificate == "ambiguous"
    assert [p.token for p, t in zip(got, seq) if t not in (7, 8)] == [40, 91, 150]  # the others recovered
    assert all(p.noise > 0 for p in got)


def test_float32_is_the_search_it_always_was():
    """A zero floor (float32) changes nothing: every field of every position is the one the search gives without
    floors, at the table's first position and after it."""
    reader = LayerReader(tiny("llama", 1), 2)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(1, V, (3,), generator=g).tolist() for _ in range(3)]
    states = [reader.full_states(torch.tensor([s]))[0] for s in seqs]
    targets = states[:1] + [s + x * s.norm(dim=-1, keepdim=True) * torch.randn(s.shape, generator=g) / s.shape[-1] ** 0.5
                            for s, x in zip(states[1:], (0.02, 0.3))]  # match and nearest
    read = [read_as(t, "float32") for t in targets]
    assert all(a is b for a, b in zip(read, targets))
    search = Lockstep(reader, FAST)
    first = torch.stack([t[0] for t in read])
    plain = search.group(read, [], seqs, search.first.first_positions([], first))
    zero = search.group(read, [], seqs, search.first.first_positions([], first, floors=torch.zeros(3)),
                        floors=[noise_floor(t, "float32") for t in read])
    strip = lambda ps: [{k: v for k, v in vars(p).items() if k != "seconds"} for p in ps]  # noqa: E731
    assert [strip(p) for p in plain] == [strip(p) for p in zero]
    kinds = {p.certificate for ps in plain for p in ps}
    assert {"match", "nearest"} <= kinds and "ambiguous" not in kinds, kinds


def test_the_fingerprint_of_a_float32_run_is_the_one_written_before_the_option():
    from dataclasses import asdict

    from memlab.probes.invert.options import InvertOptions
    from memlab.probes.invert.trust import fingerprint

    opts = asdict(InvertOptions())
    before = json.loads(json.dumps(opts))
    del before["positions"]["states_dtype"]
    assert fingerprint(opts) == fingerprint(before)
    opts["positions"]["states_dtype"] = "int8"
    assert fingerprint(opts) != fingerprint(before)


def _cli(*argv, capsys):
    from memlab.app.cli import main

    code = main(["invert", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv, says", [
    (["--states-dtype", "int3"], "--states-dtype takes float32, bfloat16, float16, int8 or int4, got 'int3'"),
    (["--states-dtype", "INT8"], "--states-dtype takes"),
    (["--states", "mean", "--states-dtype", "int8"], "--states-dtype applies to --states positions"),
])
def test_bad_values_are_refused_in_one_line(argv, says, capsys):
    code, cap = _cli("--model", "memlab-lm", "--layer", "2", *argv, capsys=capsys)
    errors = [ln for ln in cap.err.splitlines() if ln.startswith("memlab: error:")]
    assert code == 2 and len(errors) == 1 and says in errors[0], cap.err


ARGS = ["--model", "memlab-lm", "--layer", "2", "--seq-len", "8", "--n", "3", "--threads", "1", "--budget", "64",
        "--no-exhaustive", "--states-dtype", "int4"]


@pytest.fixture(scope="module")
def int4_run(tmp_path_factory):
    from memlab.app.cli import main

    run = tmp_path_factory.mktemp("precision") / "whole"
    assert main(["invert", *ARGS, "--out", str(run)]) == 0
    return run


def test_a_run_reports_and_records_ambiguous_positions(int4_run):
    rep = json.loads((int4_run / "report.json").read_text())
    assert rep["states_dtype"] == "int4" and rep["search"]["states_dtype"] == "int4"
    assert rep["noise_floor"]["median"] > 0.05 and "ambiguous" in rep["certificates"]
    at = [[c["index"], i] for c in rep["chunks"] for i, x in enumerate(c["certificates"]) if x == "ambiguous"]
    assert at and rep["ambiguous"] == at and rep["certificates"]["ambiguous"] == len(at)
    certified = sum(rep["certificates"][k] for k in ("match", "separated", "nearest"))
    assert rep["totals"]["certified"]["value"] == pytest.approx(certified / sum(rep["certificates"].values()))
    summary = (int4_run / "summary.txt").read_text()
    assert "read as int4" in summary and f"ambiguous (two candidates within the noise floor of the states as " \
        f"read): {len(at)} positions (chunk {at[0][0]} position {at[0][1]}" in summary
    for c in rep["chunks"]:
        assert len(c["noise"]) == len(c["true_ids"]) and all(f > 0 for f in c["noise"])
        assert not any(x == "match" and t != r for x, t, r in zip(c["certificates"], c["true_ids"], c["recovered_ids"]))


def test_a_resume_keeps_ambiguous_records_and_refuses_a_match_within_the_floor(int4_run, tmp_path, capsys):
    from memlab.probes.invert.trust import seal

    cut = _cut(int4_run, tmp_path)
    code, cap = _cli("--resume", str(cut), capsys=capsys)
    assert code == 0 and "memlab: warning:" not in cap.err, cap.err
    assert "resumed: 3 of 3 chunks kept, 0 to search" in (cut / "log.txt").read_text()
    assert json.loads((cut / "report.json").read_text())["ambiguous"] == \
        json.loads((int4_run / "report.json").read_text())["ambiguous"]

    cut2 = _cut(int4_run, tmp_path / "again")
    recs = sorted((json.loads(x) for x in (cut2 / "chunks.jsonl").read_text().splitlines()), key=lambda r: r["index"])
    i, pos = next((r["index"], p) for r in recs for p, x in enumerate(r["certificates"]) if x == "ambiguous")
    recs[i]["certificates"][pos] = "match"  # a match the floor does not bear out, its checksum made to match
    body = [json.dumps(seal({k: v for k, v in r.items() if k not in ("run", "sha")}, r["run"])) for r in recs]
    (cut2 / "chunks.jsonl").write_text("".join(x + "\n" for x in body))
    code, cap = _cli("--resume", str(cut2), capsys=capsys)
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("memlab: warning:")]
    assert code == 0 and len(warnings) == 1 and f"chunk {i}" in warnings[0] and "noise floor" in warnings[0], cap.err
    assert "resumed: 2 of 3 chunks kept, 1 to search" in (cut2 / "log.txt").read_text()
    again = json.loads((cut2 / "report.json").read_text())
    assert again["chunks"][i]["certificates"][pos] == "ambiguous"  # searched again: the kind the states give
