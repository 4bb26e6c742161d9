"""The bottleneck figure: what each instrument reads of a chunk against its length, in one plot and one table.

    python benchmarks/invert_lengths.py --model smollm2 --layer 15 --lengths 8,16 --n 4 \\
        --cache-dir runs/invert-cache --positions-from runs/invert-lengths-2chunks/lengths.json \\
        --last-runs runs/invert-last-8,runs/invert-last-16,runs/invert-last-32,runs/invert-last-64 \\
        --probe-table "docs/results/probes.md:SmolLM2-135M, last token" \\
        --probe-sweep runs/probe-smollm2-mean-lengths/curve.json --out runs/invert-lengths

Instruments (each drawn where given):

* **per-position states, inversion**: for each of ``--lengths`` the first ``--n`` of the probe's length sweep's
  held-out chunks (``chunk_by=tokens``, ``n_eval`` 200, seed 0, the test split) inverted from their states at
  ``--layer`` in this run (one model load, one first-position table, kept in ``--cache-dir``);
  ``--positions-from`` adds the lengths an earlier run of this benchmark measured (its lengths.json) that this run
  did not;
* **last token and mean pool, inversion**: the report.json of ``memlab invert --states last`` and ``--states mean``
  runs (``--last-runs``, ``--mean-runs``, one folder a length, on the same chunks): the search's token accuracy and
  exact match, and its control's;
* **trained probes**: ``--probe-table FILE:LINE`` (the markdown table after the line that starts with LINE, as
  ``memlab probe`` sweeps print them; label from ``--probe-table-label``) and ``--probe-sweep`` (a length sweep's
  curve.json; label from its pooling): teacher-forced and free-running token accuracy, their controls, and bits
  per chunk.

The shared unit is the free-running token accuracy (the share of a chunk's tokens an instrument's own output holds
at their place; an inversion never reads a true token, so its token accuracy is free-running); bits per chunk
exist only for a read-out that assigns probabilities. Writes lengths.json and lengths.png into --out and prints the
markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from memlab.tables import markdown_table

NUM = r"-?\d+(?:\.\d+)?"


def _cell(text: str) -> dict | None:
    """A markdown cell ``0.05 [0.04, 0.06]`` -> {value, low, high}; ``0.05`` -> {value}; ``no evidence [a, b]`` ->
    {value: None, low, high}; else None."""
    m = re.match(rf"\s*({NUM})?\s*(?:no evidence\s*)?(?:\[({NUM}),\s*({NUM})\])?", text)
    if not m or (m.group(1) is None and m.group(2) is None):
        return None
    out = {"value": float(m.group(1)) if m.group(1) is not None else None}
    if m.group(2) is not None:
        out |= {"low": float(m.group(2)), "high": float(m.group(3))}
    return out


PROBE_COLUMNS = {"token accuracy": "token_accuracy", "control": "control_accuracy",
                 "free-running accuracy": "free_running_accuracy",
                 "control free-running": "control_free_running_accuracy", "bits per chunk": "bits_per_chunk"}
"""A probe sweep table's columns -> the keys drawn."""


def probe_table(spec: str) -> dict[int, dict]:
    """``FILE:LINE`` -> {length: {key: {value[, low, high]}}} from the first markdown table after the line that
    starts with LINE (columns as ``memlab probe`` length sweeps print them)."""
    path, _, head = spec.partition(":")
    lines = Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    cols = [c.strip() for c in lines[first].strip("|").split("|")]
    out = {}
    for line in lines[first + 2 : end]:
        cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
        out[int(float(cells[cols[0]]))] = {key: c for col, key in PROBE_COLUMNS.items()
                                           if col in cells and (c := _cell(cells[col])) is not None}
    return out


def probe_sweep(path: str) -> tuple[dict[int, dict], str]:
    """A length sweep's curve.json -> ({length: {key: {value, low, high} or {value}}}, its pooling)."""
    data = json.loads(Path(path).read_text())
    out = {}
    for row in data["rows"]:
        got = {k: row["readings"][k] for k in ("token_accuracy", "free_running_accuracy", "bits_per_chunk")
               if k in row.get("readings", {})}
        for k in ("control_accuracy", "control_free_running_accuracy"):
            if row.get(k) is not None:
                got[k] = {"value": row[k]}
        out[int(row["seq_len"])] = got
    options = data.get("options") or {}
    return out, str(options.get("pool") or data.get("pool") or "pooled")


def pooled_runs(folders: list[str]) -> dict[int, dict]:
    """``memlab invert --states last|mean`` run folders -> {length: the run's totals and facts}."""
    out = {}
    for folder in folders:
        rep = json.loads((Path(folder) / "report.json").read_text())
        t = rep["totals"]
        out[int(rep["text"]["seq_len"])] = {
            "chunks": len(rep["chunks"]), "layer": rep["layer"], "states": rep["states"],
            "forwards": rep["search"]["forwards"], "machine": rep["machine"], "run": str(folder),
            "method": rep["search"].get("method", "swap"), "gflops": rep["search"].get("gflops"),
            "gflops_per_chunk": t["seconds_per_chunk"]["value"] * rep["machine"]["matmul_gflops"],
            **{k: t[k] for k in ("token_accuracy", "exact_match", "token_f1", "distance", "seconds_per_chunk",
                                 "control_token_accuracy", "control_exact_match", "control_token_f1")}}
    return out


def measure_positions(args, res: dict) -> None:
    """Per-position inversion of the first ``--n`` chunks at each of ``--lengths`` (into ``res["positions"]``)."""
    import torch

    from memlab.probes.invert.options import PositionsOptions, TextOptions
    from memlab.probes.invert.positions.searcher import Searcher
    from memlab.probes.invert.report import chunk_result, totals
    from memlab.probes.invert.positions.run import first_table, observed_states
    from memlab.probes.invert.start import chunk_ids, load, machine_facts

    torch.set_num_threads(args.threads)
    enc, reader = load(args.model, args.layer, "cpu")
    searcher = Searcher(reader, PositionsOptions())
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    table = first_table(searcher, enc.prefix, args.cache_dir, None)
    res.update(layer=reader.layer, machine=machine_facts(), table_seconds=time.perf_counter() - t0)
    for length in [int(x) for x in args.lengths.split(",") if x]:
        text = TextOptions(n=args.n, n_eval=200, chunk_by="tokens", seq_len=length)
        texts, chunks = chunk_ids(text, enc.tokenizer)
        states = [observed_states(reader, enc.prefix, c, 0.0, gen) for c in chunks]
        firsts = searcher.first_positions(enc.prefix, torch.stack([s[0] for s in states]), table=table)
        results = []
        for i, (text, ids, s, f) in enumerate(zip(texts, chunks, states, firsts)):
            start = time.perf_counter()
            got = searcher.chunk(s, enc.prefix, ids, first=f)
            results.append(chunk_result(i, text, ids, got, enc.tokenizer.decode, time.perf_counter() - start))
        t = {k: v.to_dict() for k, v in totals(results).items()}
        res["positions"][str(length)] = {"chunks": len(chunks), "totals": t, "source": "this run",
                                         "certificates": [x for c in results for x in c.certificates]}
        print(f"{length} tokens: exact {t['exact_match']['value']:.2f} token accuracy "
              f"{t['token_accuracy']['value']:.3f} s/token {t['seconds_per_token']['value']:.2f}", flush=True)
        yield


def _errorbar(ax, xs, cells, fmt, label, color, offset=1.0):
    """Readings ({value, low, high} or {value}) against length, with their intervals as error bars."""
    pts = [(x * offset, c) for x, c in zip(xs, cells) if c is not None and c.get("value") is not None]
    if not pts:
        return
    x = [p[0] for p in pts]
    v = [p[1]["value"] for p in pts]
    lo = [p[1]["value"] - p[1].get("low", p[1]["value"]) for p in pts]
    hi = [p[1].get("high", p[1]["value"]) - p[1]["value"] for p in pts]
    ax.errorbar(x, v, yerr=[lo, hi], fmt=fmt, color=color, label=label, capsize=2, ms=4, lw=1)


def plot(res: dict, path: Path) -> None:
    """Left: free-running token accuracy (and the inversions' exact match) of every instrument, controls dashed;
    right: the trained probes' bits per chunk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    pos = res["positions"]
    xs = sorted(int(k) for k in pos)
    _errorbar(ax, xs, [pos[str(x)]["totals"]["token_accuracy"] for x in xs], "-o",
              f"per-position states, inversion (layer {res.get('layer')})", "C0")
    _errorbar(ax, xs, [pos[str(x)]["totals"]["exact_match"] for x in xs], "--s", "  the same: exact match", "C0",
              1.04)
    lx = []
    for key, color, shift in (("last", "C3", 1.04), ("mean", "C5", 1.08)):
        runs = res.get(key) or {}
        kx = sorted(int(k) for k in runs)
        lx += kx
        if kx:
            first = runs[str(kx[0])]
            _errorbar(ax, kx, [runs[str(x)]["token_accuracy"] for x in kx], "-D",
                      f"{POOLED_LABEL[key]}, inversion (layer {first['layer']}, {_budget(first)})", color)
            _errorbar(ax, kx, [runs[str(x)]["control_token_accuracy"] for x in kx], ":D", "  its control", color,
                      shift)
    for i, (name, rows) in enumerate(res["probes"].items()):
        px = sorted(int(k) for k in rows)
        color = f"C{i + 1}" if i < 2 else f"C{i + 4}"
        _errorbar(ax, px, [rows[str(x)].get("free_running_accuracy") for x in px], "-^",
                  f"{name}, trained probe: free-running", color, 0.96)
        _errorbar(ax, px, [rows[str(x)].get("control_free_running_accuracy") for x in px], ":^", "  its control",
                  color, 0.92)
        _errorbar(bx, px, [rows[str(x)].get("bits_per_chunk") for x in px], "-^", f"{name}, trained probe", color,
                  1.0 + 0.04 * i)
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        ticks = sorted(set(xs) | set(lx) | {int(k) for r in res["probes"].values() for k in r})
        a.set_xticks(ticks, [str(t) for t in ticks])
        a.set_xlabel("chunk length (tokens)")
        a.grid(alpha=0.3)
    ax.set_ylim(-0.03, 1.05)
    ax.set_ylabel("free-running token accuracy / exact match")
    ax.legend(fontsize=7)
    bx.axhline(0, color="grey", lw=0.8)
    bx.set_ylabel("bits per chunk over the control")
    bx.legend(fontsize=7)
    fig.suptitle(f"{res['model']}: what each instrument reads of a chunk against its length (95% intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


POOLED_LABEL = {"last": "last token", "mean": "mean pool"}
"""The pooled inversions drawn (``--last-runs``, ``--mean-runs``) and their labels."""


def _budget(run: dict) -> str:
    """A pooled inversion's budget as its runs set it: GFLOP-equivalents per chunk, or candidate forwards (the
    earlier swap search's runs)."""
    if run.get("method", "swap") != "swap" and run.get("gflops") is not None:
        return f"{run['gflops']:,.0f} GFLOP-eq per chunk"
    return f"{run['forwards']} forwards"


def _fmt(c: dict | None, digits: int = 3) -> str:
    if not c:
        return "-"
    if c.get("value") is None:
        return f"no evidence [{c['low']:.2f}, {c['high']:.2f}]"
    if "low" not in c:
        return f"{c['value']:.{digits}f}"
    return f"{c['value']:.{digits}f} [{c['low']:.{digits}f}, {c['high']:.{digits}f}]"


def markdown(res: dict) -> str:
    """One line per length and instrument: chunks, free-running token accuracy, its control, exact match,
    teacher-forced token accuracy and bits per chunk where the instrument has them."""
    head = ["length (tokens)", "instrument", "chunks", "free-running token accuracy", "control", "exact match",
            "teacher-forced token accuracy (control)", "bits per chunk"]
    lines = [markdown_table(head)]  # the rows below: rows of their own shapes
    lengths = sorted({int(k) for k in res["positions"]} | {int(k) for key in POOLED_LABEL for k in res.get(key, {})}
                     | {int(k) for r in res["probes"].values() for k in r})
    for n in lengths:
        if (p := res["positions"].get(str(n))) is not None:
            t = p["totals"]
            lines.append(f"| {n} | per-position states, inversion | {p['chunks']} | {_fmt(t['token_accuracy'])} | - | "
                         f"{_fmt(t['exact_match'], 2)} | - | - |")
        for key, label in POOLED_LABEL.items():
            if (q := res.get(key, {}).get(str(n))) is not None:
                lines.append(f"| {n} | {label}, inversion ({_budget(q)}) | {q['chunks']} | "
                             f"{_fmt(q['token_accuracy'])} | {_fmt(q['control_token_accuracy'])} | "
                             f"{_fmt(q['exact_match'], 2)} | - | - |")
        for name, rows in res["probes"].items():
            if (r := rows.get(str(n))) is None:
                continue
            ctl = r.get("control_accuracy")
            lines.append(f"| {n} | {name}, trained probe | {r.get('n_eval', res.get('probe_chunks', '-'))} | "
                         f"{_fmt(r.get('free_running_accuracy'))} | {_fmt(r.get('control_free_running_accuracy'))} | "
                         f"- | {_fmt(r.get('token_accuracy'))} ({_fmt(ctl)}) | {_fmt(r.get('bits_per_chunk'), 2)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layer", type=int, default=-1)
    ap.add_argument("--lengths", default="8,16,32,64", help="per-position lengths measured in this run ('' none)")
    ap.add_argument("--n", type=int, default=2, help="chunks per length (per-position inversion)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--positions-from", default=None, help="lengths.json of an earlier run: its other lengths")
    ap.add_argument("--last-runs", default="", help="memlab invert --states last run folders, comma-separated")
    ap.add_argument("--mean-runs", default="", help="memlab invert --states mean run folders, comma-separated")
    ap.add_argument("--probe-table", default=None, help="FILE:LINE of a probe length sweep's markdown table")
    ap.add_argument("--probe-table-label", default="last token")
    ap.add_argument("--probe-table-chunks", type=int, default=200, help="held-out chunks behind --probe-table")
    ap.add_argument("--probe-sweep", default=None, help="a probe length sweep's curve.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python", "benchmarks/invert_lengths.py", *sys.argv[1:]]), "model": args.model,
           "layer": None, "positions": {}, "last": {}, "mean": {}, "probes": {}}
    for key, folders in (("last", args.last_runs), ("mean", args.mean_runs)):
        if folders:
            res[key] = {str(k): v for k, v in pooled_runs([f for f in folders.split(",") if f]).items()}
    if args.probe_table:
        rows = probe_table(args.probe_table)
        res["probes"][args.probe_table_label] = {str(k): dict(v, n_eval=args.probe_table_chunks)
                                                 for k, v in rows.items()}
    if args.probe_sweep:
        rows, pool = probe_sweep(args.probe_sweep)
        n_eval = {int(r["seq_len"]): r.get("n_eval") for r in json.loads(Path(args.probe_sweep).read_text())["rows"]}
        label = {"mean": "mean pool", "last": "last token"}.get(pool, pool)
        res["probes"][label] = {str(k): dict(v, n_eval=n_eval.get(k)) for k, v in rows.items()}
    t0 = time.perf_counter()
    earlier = json.loads(Path(args.positions_from).read_text()) if args.positions_from else None

    def write() -> None:
        if earlier is not None:
            rows = [{**r, "seq_len": int(k)} for k, r in earlier.get("positions", {}).items()]  # this benchmark's
            for row in earlier.get("lengths", []) + rows:  # (or an older lengths.json's) lengths not measured here
                key = str(row["seq_len"])
                if key not in res["positions"] or res["positions"][key]["source"] != "this run":
                    res["positions"][key] = {**row, "source": row.get("source", args.positions_from)
                                             if row.get("source") != "this run" else args.positions_from}
            res["layer"] = res["layer"] or earlier.get("layer")
            res["earlier_machine"] = earlier.get("machine")
        (out / "lengths.json").write_text(json.dumps(res, indent=2))
        plot(res, out / "lengths.png")

    if args.lengths:
        for _ in measure_positions(args, res):
            write()  # after each length: a killed run keeps what it measured
    write()
    print(markdown(res))
    print(f"wrote {out / 'lengths.json'} and {out / 'lengths.png'} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
