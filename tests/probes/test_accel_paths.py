"""Both sides of every hardware-dependent choice (:mod:`memlab.devices`), forced on any CPU: bf16 compute and
autocast, batched (vmapped) probe decoder groups, training's mixed precision; and the switch that forces them
(``MEMLAB_ACCEL`` and :func:`memlab.devices.pretend`). bf16 runs on every CPU, emulated where not native."""

from __future__ import annotations

import json
import math

import pytest
import torch
from accelerate.state import AcceleratorState
from safetensors.torch import load_file

import memlab.probes.decoder.group as group_mod
from conftest import one_line_error, write_config
from memlab import devices
from memlab.app.cli import main
from memlab.config import TrainConfig
from memlab.errors import MemlabError
from memlab.probes.encoders.capture import HiddenStateEncoder
from memlab.probes.decoder.fitloop import train_decoders
from memlab.probes.decoder.group import DecoderGroup, autocast_context
from memlab.probes.run import load_options, run_probe
from memlab.probes.encoders.sources import resolve_dtype
from memlab.registry import FAMILIES
from memlab.train import processes as train_devices
from memlab.train.loop import Trainer
from memlab.train.setup import StepOutput, TrainSetup
from test_probe_group import _curve, _data, _members, _opts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def fresh_accelerate():
    """accelerate keeps one mixed precision a process: each run here starts and leaves it unset."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _autocasting(ctx) -> bool:
    with ctx:
        return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


# ---------------------------------------------------------------- the switch


@pytest.mark.parametrize("side", ["none", "native"])
def test_the_switch_forces_each_side_of_every_auto_choice(side, monkeypatch):
    monkeypatch.setenv(devices.ACCEL_ENV, side)
    on = side == "native"
    want = torch.bfloat16 if on else torch.float32
    assert devices.forced() == devices.Accel(bf16=on, batched=on)
    assert resolve_dtype("auto", "cpu") == want and devices.auto_dtype("cpu") == want  # the encoder's weights
    assert _autocasting(autocast_context(torch.device("cpu"))) == on  # probe decoders
    assert train_devices.mixed_precision("auto", cpu=True) == ("bf16" if on else "no")  # training
    assert _autocasting(train_devices.SetupEnv().frozen_autocast()) == on  # a recipe's frozen precompute
    z, ids = _data(n=16)
    decs = _members(_opts(), z, ids)
    assert DecoderGroup([d for d, _ in decs], [zz for _, zz in decs], ids, _opts()).batched == on
    assert train_devices.mixed_precision("fp16", cpu=True) == "fp16"  # an explicit choice is never overridden


def test_pretend_wins_over_the_variable_and_restores_it(monkeypatch):
    monkeypatch.setenv(devices.ACCEL_ENV, "none")
    with devices.pretend(bf16=True):
        assert devices.native_bf16("cpu") and devices.native_bf16("mps")
        assert not devices.batched_groups("cpu")  # not forced: the hardware's own (a CPU runs member by member)
        with devices.pretend(batched=True):
            assert devices.batched_groups("cpu") and devices.native_bf16("cpu") == bool(
                {"avx512_bf16", "amx_bf16"} & devices.cpu_flags())  # bf16 left to the hardware in here
    assert devices.forced() == devices.ACCEL_SIDES["none"]
    monkeypatch.setenv(devices.ACCEL_ENV, "auto")
    assert devices.forced() == devices.Accel()


def test_auto_keeps_the_hardware_choices(monkeypatch):
    """No switch: bf16 and batched groups on a CUDA GPU of compute capability >= 8, float32 before it, a CPU by its
    flags (probes) and float32 training whatever the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with devices.pretend():
        for cap, bf16 in (((8, 0), True), ((7, 5), False)):
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=cap: c)
            assert devices.auto_dtype("cuda") == (torch.bfloat16 if bf16 else torch.float32)
            assert devices.mixed_precision("auto", "cuda") == ("bf16" if bf16 else "no")
            assert devices.batched_groups("cuda")  # on any accelerator
        for flags, bf16 in (({"fpu", "amx_bf16"}, True), ({"avx512_bf16"}, True), ({"avx2"}, False)):
            monkeypatch.setattr(devices, "cpu_flags", lambda f=flags: frozenset(f))
            assert devices.auto_dtype("cpu") == (torch.bfloat16 if bf16 else torch.float32)
            assert devices.mixed_precision("auto", "cpu") == "no" and not devices.batched_groups("cpu")
        assert not devices.native_bf16("mps")
        assert not devices.async_copies("cpu") and devices.uses_tf32("cuda") and not devices.uses_tf32("cpu")
        assert devices.fused_adamw("cpu") and not devices.fused_adamw(None)


def test_a_wrong_switch_is_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(devices.ACCEL_ENV, "gpu")
    with pytest.raises(MemlabError, match="MEMLAB_ACCEL=gpu: use auto, native or none"):
        devices.forced()
    out = tmp_path / "run"
    assert main(["probe", "--model", "synthetic:concat", "--out", str(out)]) == 2
    assert "MEMLAB_ACCEL=gpu" in one_line_error(capsys) and not out.exists()


def test_host_copies_keep_the_values():
    rows = torch.tensor([3, 1, 2])
    assert torch.equal(devices.to_device(rows, torch.device("cpu")), rows)


# ---------------------------------------------------------------- probe decoder groups


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_group_batched_or_member_by_member_trains_as_its_members_alone(bf16, monkeypatch):
    """In float32 and under bf16 autocast alike: batched (vmap) and member by member, to float32 tolerance."""
    calls = []
    real = group_mod.member_nll

    def spy(*a, **k):
        calls.append(torch.is_autocast_enabled("cpu"))
        return real(*a, **k)

    monkeypatch.setattr(group_mod, "member_nll", spy)
    z, ids = _data(n=48)
    opts = _opts(epochs=2, patience=1, val_fraction=0.25)
    with devices.pretend(bf16=bf16):
        alone = []
        for dec, zz in _members(opts, z, ids):
            hist, _ = train_decoders([dec], [zz], ids, opts)
            alone.append((dec, hist[0]))
        runs, counts = {}, {}
        for batched in (True, False):
            n0 = len(calls)
            members = _members(opts, z, ids)
            hists, _ = train_decoders([d for d, _ in members], [zz for _, zz in members], ids, opts, batched=batched)
            runs[batched], counts[batched] = (members, hists), len(calls) - n0
    assert calls and all(c == bf16 for c in calls)  # every member's pass ran in the forced precision
    assert counts[True] < counts[False]  # batched: one pass for all members, not one each
    for members, hists in runs.values():
        for (a, ha), (b, _), hb in zip(alone, members, hists):
            for key in ("loss", "val_ce", "best_val_ce"):
                want, got = _curve(ha, key), _curve(hb, key)
                assert want and got == pytest.approx(want, rel=1e-4, abs=1e-5), key
            sa, sb = a.state_dict(), b.state_dict()
            for k in sa:
                assert torch.allclose(sa[k], sb[k], atol=1e-5), k
    with devices.pretend(bf16=not bf16):  # the other precision does compute otherwise
        (dec, zz), *_ = _members(opts, z, ids)
        other = _curve(train_decoders([dec], [zz], ids, opts)[0][0], "loss")
    assert other != _curve(alone[0][1], "loss")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_one_step_of_a_batched_group_computes_as_its_members_one_by_one(bf16):
    """One step's losses and gradients, vmapped or member by member: equal to float32 rounding in either
    precision (bf16 rounding in one path and not the other would show here at ~1e-3)."""
    z, ids = _data(n=32)
    members = _members(_opts(), z, ids)
    with devices.pretend(bf16=bf16):
        g = DecoderGroup([d for d, _ in members], [zz for _, zz in members], ids, _opts())
        zn, inputs, tc, _, _ = g._batch(torch.arange(16), noise=False)
        out = {}
        for batched in (True, False):
            g.batched = batched
            for p in g.params:
                p.grad = None
            loss = g.nll(zn, inputs, tc)  # (G,)
            loss.sum().backward()
            out[batched] = loss.detach(), [p.grad.clone() for p in g.params]
    (la, ga), (lb, gb) = out[True], out[False]
    assert torch.allclose(la, lb, rtol=1e-5)
    for n, a, b in zip(g.names, ga, gb):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max() + 1e-12, n


def test_a_probe_end_to_end_with_a_bf16_encoder_and_bf16_decoders(tiny_llama, small_corpus, tmp_path, monkeypatch):
    seen = {"encoder": set(), "decoder": set()}
    real_encode, real_nll = HiddenStateEncoder.encode, group_mod.member_nll

    def encode(self, *a, **k):
        seen["encoder"].add(next(self.model.parameters()).dtype)
        return real_encode(self, *a, **k)

    def nll(*a, **k):
        seen["decoder"].add(torch.is_autocast_enabled("cpu"))
        return real_nll(*a, **k)

    monkeypatch.setattr(HiddenStateEncoder, "encode", encode)
    monkeypatch.setattr(group_mod, "member_nll", nll)
    tiny = ["hidden_size=32", "num_heads=4", "num_layers=1", "batch_size=16", "seq_len=6", "n_train=48", "n_eval=16",
            "epochs=2", "n_examples=0", "device=cpu", f"corpus={small_corpus}", f"model={tiny_llama}"]
    reps = {}
    for bf16 in (False, True):
        seen = {"encoder": set(), "decoder": set()}
        opts = load_options(None, [*tiny, f"encoder_dtype={'bfloat16' if bf16 else 'float32'}"])
        with devices.pretend(bf16=bf16, batched=bf16):
            reps[bf16] = run_probe(opts, tmp_path / str(bf16))
        want = torch.bfloat16 if bf16 else torch.float32
        assert seen == {"encoder": {want}, "decoder": {bf16}}
    rep = json.loads((tmp_path / "True" / "report.json").read_text())
    for side in ("probe", "control"):
        assert math.isfinite(rep[side]["ce"]) and 0 <= rep[side]["token_accuracy"] <= 1
        assert reps[True].probe["ce"] == pytest.approx(reps[False].probe["ce"], rel=2e-2)


# ---------------------------------------------------------------- training


def _collate(items: list[dict]) -> dict:
    return {k: (torch.stack([it[k] for it in items]) if torch.is_tensor(v) else v) for k, v in items[0].items()}


def _family_steps(name: str, precision: str, out) -> tuple[list[float], list[bool], dict]:
    """Two optimizer steps of family ``name``'s toy model in the training loop: losses, autocast seen, summary."""
    fam = FAMILIES.get(name)
    torch.manual_seed(0)
    config = fam.make_config("toy")
    inputs = fam.example_inputs(config, 4)
    data = [{k: (v[i] if torch.is_tensor(v) else v) for k, v in inputs.items()} for i in range(4)]
    losses, amp = [], []

    def loss_fn(model, batch):
        torch.manual_seed(1)  # the same noise (diffusion timesteps, dropout) in both runs
        loss = model(**{k: v for k, v in batch.items() if k in inputs}).loss
        losses.append(float(loss.detach()))
        amp.append(torch.is_autocast_enabled("cpu"))
        return StepOutput(loss)

    cfg = TrainConfig(max_steps=2, batch_size=2, lr=1e-3, warmup_steps=0, eval_every=100, save_every=100,
                      log_every=1, mixed_precision=precision, cpu=True, progress=False)
    out.mkdir(parents=True)
    summary = Trainer(TrainSetup(fam.model_class(config), data, None, loss_fn, collate_fn=_collate), cfg, out).train()
    return losses, amp, summary


@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_family_trains_under_bf16_as_in_float32(name, tmp_path):
    ref, ref_amp, _ = _family_steps(name, "no", tmp_path / "fp32")
    AcceleratorState._reset_state(reset_partial_state=True)
    got, amp, summary = _family_steps(name, "bf16", tmp_path / "bf16")
    assert summary["mixed_precision"] == "bf16" and all(amp) and not any(ref_amp)
    assert len(got) == len(ref) == 2 and all(math.isfinite(x) for x in got)
    assert got == pytest.approx(ref, rel=1e-2) and got != ref  # close, and computed in another precision


@pytest.mark.usefixtures("fresh_accelerate")
def test_a_bf16_run_resumes_exactly(tmp_path, small_corpus):
    """Stopped at its checkpoint and resumed, a bf16 run ends with the weights and losses of one that ran through."""
    cfg = write_config(tmp_path / "c.yaml", small_corpus,
                       train={"max_steps": 6, "save_every": 3, "eval_every": 100, "min_lr_ratio": 1.0,
                              "warmup_steps": 0, "mixed_precision": "bf16"},
                       model={"overrides": {"attention_dropout": 0.2}})
    full, split = tmp_path / "full", tmp_path / "split"
    assert main(["train", str(cfg), "--out", str(full)]) == 0
    assert main(["train", str(cfg), "--out", str(split), "train.max_steps=3"]) == 0
    assert main(["train", "--resume", str(split), "train.max_steps=6"]) == 0
    assert json.loads((split / "summary.json").read_text())["mixed_precision"] == "bf16"
    a, b = (load_file(str(r / "checkpoints" / "step-00000006" / "model.safetensors")) for r in (full, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(run):
        return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]

    assert losses(split) == losses(full) and len(losses(full)) == 6
