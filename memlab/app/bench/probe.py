"""Part (d): the inversion probe's time split: the frozen encoder's pass over the data vs the
decoder's training (and the control decoder), from the probe report's own timers.

Runs ``memlab.probes`` on the packaged all-MiniLM-L6-v2 (no download) with a bounded
number of chunks and epochs; the split, not the absolute time, is the result.
"""

from __future__ import annotations

from typing import Any


def run_probe_split(device, quick: bool = False, log=print, model: str = "minilm", n_train: int = 512,
                    epochs: float = 2.0, out_dir=None) -> dict[str, Any]:
    try:
        from memlab.probes.run import load_options, run_probe
    except ImportError:
        return {"skipped": "memlab.probes is not installed"}
    from memlab.errors import MemlabError

    kw = dict(model=model, n_train=32 if quick else n_train, n_eval=16 if quick else 128, epochs=1.0 if quick else epochs,
              seq_len=16 if quick else 32, hidden_size=32 if quick else 128, device=str(device), progress=False,
              control=not quick, n_examples=1, val_fraction=0.0)  # every epoch runs: no early stopping
    try:
        opts = load_options(None, **kw)
        report = run_probe(opts, out_dir)
    except (MemlabError, OSError, RuntimeError) as e:
        return {"error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}", "options": kw}
    t = report.timing
    res = {"model": model, "options": kw, "encode_s": t["encode_s"], "decoder_train_s": t["train_s"],
           "control_train_s": t.get("control_s") or 0.0, "load_s": t["load_s"], "total_s": t["total_s"],
           "encode_cached": t.get("encode_cached")}
    work = res["encode_s"] + res["decoder_train_s"] + res["control_train_s"]
    res["encode_share"] = res["encode_s"] / work if work else None
    log(f"probe split: encode {res['encode_s']:.2f}s, decoder {res['decoder_train_s']:.2f}s, "
        f"control {res['control_train_s']:.2f}s")
    return res


DEFAULT_SHAPE = {"seq_len": 48, "vocab": 8192, "embed_dim": 384, "members": 3}
"""``memlab probe --model minilm`` at its defaults, as its decoders train: chunks of 32 words are up to 48 MiniLM
tokens, 8,192 kept ids, MiniLM's 384-wide embedding, three candidates in one group (the contained probe with the bag
head, the plain decoder and the random start)."""

QUICK_SHAPE = {"seq_len": 16, "vocab": 512, "embed_dim": 64, "members": 3, "hidden_size": 32}
"""A shape that checks the harness in seconds (``memlab bench --quick``)."""


def probe_decoder_mfu(device, quick: bool = False, log=print) -> dict[str, Any]:
    """The probe decoders' training MFU at the MiniLM default's shape (:data:`DEFAULT_SHAPE`), in float32 against
    the float32 matmul rate (2048 x 2048) of the same run, and, where the device computes the probe's decoders in
    bf16 (:func:`memlab.devices.auto_dtype`), as they train there, against the same float32 rate."""
    import torch

    from memlab.devices import auto_dtype, pretend

    kw = dict(QUICK_SHAPE if quick else DEFAULT_SHAPE, steps=3 if quick else 10, matmul_n=2048, log=log)
    with pretend(bf16=False):
        res = {"float32": decoder_mfu(device, **kw)}
    if auto_dtype(device) != torch.float32:
        res["native"] = decoder_mfu(device, **kw)
    return res


def decoder_mfu(device="cpu", steps: int = 20, batch_size: int = 32, seq_len: int = 32, embed_dim: int = 384,
                vocab: int = 4096, hidden_size: int = 128, num_layers: int = 2, members: int = 2,
                batched: bool | None = None, matmul_n: int = 1024, log=print) -> dict[str, Any]:
    """Training MFU of the probe's decoders (the quickstart's shape by default: a probe and its control trained as
    one group, :mod:`memlab.probes.decoder.fitloop`; ``members=3`` adds the plain decoder of ``select_decoder``): FLOPs of
    one training step of the group (counted by torch's FlopCounterMode, forward and backward) times the steps per
    second, over the FLOP/s of a float32 ``matmul_n`` x ``matmul_n`` matrix multiply timed in the same run, just
    before. The decoders compute as the probe's do on ``device`` (bf16 autocast where
    :func:`memlab.devices.auto_dtype` says; ``dtype`` in the result)."""
    import time
    from dataclasses import replace

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from memlab.devices import auto_dtype
    from memlab.probes.decoder.group import DecoderGroup
    from memlab.probes.options import ProbeOptions
    from memlab.probes.decoder.fit import build_decoder
    from memlab.train.loop import measure_matmul_flops

    dev = torch.device(device)
    matmul = measure_matmul_flops(dev, n=matmul_n)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (max(batch_size, vocab), seq_len), generator=g)  # (N, T)
    ids[:vocab, 0] = torch.arange(vocab)  # every one of the kept ids occurs
    z = torch.randn(ids.shape[0], embed_dim, generator=g)  # (N, D)

    class _Tok:
        bos_token_id = 0

        def __len__(self):
            return 8 * vocab  # a compact vocabulary with an *other* class, as a real tokenizer gives

    opts = ProbeOptions(hidden_size=hidden_size, num_layers=num_layers, seq_len=seq_len, device=str(dev))
    plain = replace(opts, bag_head=False, input_dropout=opts.plain_input_dropout)
    const = z.mean(0, keepdim=True).expand_as(z)  # (N, D): the control's embedding
    chosen = {1: [(opts, z)], 2: [(opts, z), (opts, const)], 3: [(opts, z), (plain, z), (opts, const)]}[members]
    decs, zs = [], [zz for _, zz in chosen]
    for o, zz in chosen:
        decs.append(build_decoder(embed_dim, _Tok(), ids, o))
        decs[-1].set_normalization(zz)
    group = DecoderGroup(decs, zs, ids, opts, batched=batched)
    rows = torch.arange(batch_size)
    with FlopCounterMode(display=False) as fc:
        group.train_step(rows, opts.lr)
    flops = fc.get_total_flops()
    for _ in range(2):  # warm-up
        group.train_step(rows, opts.lr)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = group.train_step(rows, opts.lr)
    loss.tolist()  # the one sync
    secs = time.perf_counter() - t0
    res = {"flops_per_step": flops, "steps": steps, "seconds": secs, "decoder_flops_per_s": flops * steps / secs,
           "matmul_flops_per_s": matmul, "mfu": flops * steps / secs / matmul, "threads": torch.get_num_threads(),
           "seconds_per_step": secs / steps, "members": members,
           "shape": {"batch_size": batch_size, "seq_len": seq_len, "embed_dim": embed_dim, "kept_vocab": vocab,
                     "hidden_size": hidden_size, "num_layers": num_layers}}
    res["batched"], res["dtype"], res["matmul_n"] = group.batched, str(auto_dtype(dev)).removeprefix("torch."), matmul_n
    log(f"probe decoders ({members} in a {'batched' if group.batched else 'sequential'} group, {res['dtype']}): "
        f"{res['decoder_flops_per_s'] / 1e9:.1f} GFLOP/s, float32 matmul {matmul / 1e9:.1f} GFLOP/s, "
        f"MFU {res['mfu']:.2f} ({res['threads']} threads)")
    return res


QUICKSTART_BUDGET_S = 600
"""The quickstart's budget on a 2-core machine (docs/probes.md)."""


def quickstart_budget(out_dir, only: list[str] | None = None, fast: bool = False, log=print) -> dict[str, Any]:
    """Time ``memlab quickstart`` (``only`` some entries) with the machine's float32 matmul rate measured before and
    after it in the same run, and the decoder's MFU: the quickstart's seconds only mean something beside them."""
    import time
    from pathlib import Path

    import torch

    from memlab.app.quickstart import run_quickstart
    from memlab.train.loop import measure_matmul_flops

    cpu = torch.device("cpu")
    before = measure_matmul_flops(cpu)
    t0 = time.perf_counter()
    summary = run_quickstart(out=Path(out_dir) / "quickstart", only=only, fast=fast, progress=False)
    secs = time.perf_counter() - t0
    after = measure_matmul_flops(cpu)
    res = {"quickstart_s": secs, "budget_s": QUICKSTART_BUDGET_S, "within_budget": secs <= QUICKSTART_BUDGET_S,
           "entries": {r["name"]: r.get("seconds") for r in summary["rows"]}, "only": only, "fast": fast,
           "matmul_gflops_before": before / 1e9, "matmul_gflops_after": after / 1e9,
           "threads": torch.get_num_threads(), "calibration": {r["name"]: r.get("calibration") for r in summary["rows"]
                                                                if r["name"].startswith("synthetic:")},
           "decoder": decoder_mfu(cpu, steps=5 if fast else 20, log=log)}
    log(f"quickstart {secs:.0f}s (budget {QUICKSTART_BUDGET_S}s) at {before / 1e9:.0f}-{after / 1e9:.0f} GFLOP/s "
        f"float32 matmul, {res['threads']} threads")
    return res


PROBE_BUDGET_S = 300
"""``memlab probe --model minilm`` at its defaults on a 2-core machine: the issue's target (docs/probes.md)."""


def probe_budget(out_dir, model: str = "minilm", overrides: list[str] | None = None, log=print) -> dict[str, Any]:
    """Time ``memlab probe --model MODEL`` (at its defaults, or ``key=value`` ``overrides``) end to end, with the
    machine's float32 matmul rate measured before and after it in the same run, and the report's own timers."""
    import json
    import time
    from pathlib import Path

    import torch

    from memlab.app.cli import main
    from memlab.train.loop import measure_matmul_flops

    cpu = torch.device("cpu")
    run = Path(out_dir) / "probe"
    before = measure_matmul_flops(cpu)
    t0 = time.perf_counter()
    rc = main(["probe", "--model", model, "--out", str(run), *(overrides or [])])
    secs = time.perf_counter() - t0
    after = measure_matmul_flops(cpu)
    rep = json.loads((run / "report.json").read_text()) if rc == 0 else {}
    res = {"model": model, "overrides": list(overrides or []), "exit": rc, "probe_s": secs, "budget_s": PROBE_BUDGET_S,
           "within_budget": rc == 0 and secs <= PROBE_BUDGET_S, "timing": rep.get("timing"),
           "n_train": rep.get("n_train"), "kept_vocab": (rep.get("decoder") or {}).get("kept_vocab"),
           "matmul_gflops_before": before / 1e9, "matmul_gflops_after": after / 1e9, "threads": torch.get_num_threads()}
    log(f"memlab probe --model {model}: {secs:.0f}s (target {PROBE_BUDGET_S}s) at {before / 1e9:.0f}-"
        f"{after / 1e9:.0f} GFLOP/s float32 matmul, {res['threads']} threads")
    return res
