"""The probe's readings, pinned: the quickstart's (``--fast``) and a small ``--compare`` run's, to the last digit.

Runs both on this machine (one thread each, about two minutes on a 2-core CPU), keeps what they print and write
minus the wall-clock times and the output folders, and compares it with the saved record
(``benchmarks/probe_readings.json``): every printed line, every table cell and every reading of
``summary.json``, ``curve.json`` and each entry's ``report.json`` must be the same. A change that only moves code
around keeps them all; one that changes a reading shows the first differing lines and fails (exit 1).

    python benchmarks/probe_readings_unchanged.py            # compare with the saved record
    python benchmarks/probe_readings_unchanged.py --save     # record this machine's readings

The readings depend on the machine's arithmetic (bf16 where it is native, the CPU's kernels): record and compare
on the same machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("probe_readings.json")
TOY = ROOT / "memlab" / "resources" / "checkpoints" / "token_lm-toy"
COMPARE = ["--model", "synthetic:concat", "--compare",
           f"llama,pretrained:{TOY}[conditioning=prefix,prefix_len=2],align,bow", "--n-train", "32,64",
           "--seq-len", "8", "--n-eval", "16", "--epochs", "1", "--batch-size", "16", "--threads", "1",
           "max_chunk_tokens=32", f"chunk_tokenizer={TOY}", "n_examples=1", "ci_resamples=200"]
TIMES = {"seconds", "timing", "memory", "run_dir", "total_s", "encode_s", "load_s", "plot"}
"""Keys whose values are wall-clock times, memory or paths of this run: left out of the record."""
REPORT_KEYS = ("readings", "retention", "probe", "control", "information_gain", "bow", "readouts", "calibration",
               "limited_by", "text", "examples", "history", "decoder", "n_train", "n_eval", "vocab_size")
"""What each report.json contributes: its readings and what they were read from (not its options or timing)."""


def _clean(x, out: str):
    """``x`` without the :data:`TIMES` keys, this run's folder and the checkout's path as placeholders."""
    if isinstance(x, dict):
        return {k: _clean(v, out) for k, v in x.items() if k not in TIMES}
    if isinstance(x, list):
        return [_clean(v, out) for v in x]
    if isinstance(x, str):
        return x.replace(out, "<out>").replace(str(ROOT), "<repo>")
    return x


def _printed(text: str, out: str) -> list[str]:
    """Printed lines without their times: a trailing ``(12s)``/``, 3s``/``total 66s`` and a table's time column."""
    lines = []
    for line in text.splitlines():
        line = line.replace(out, "<out>").replace(str(ROOT), "<repo>")
        line = re.sub(r"\s*\(\d+s\)", "", line)
        line = re.sub(r", \d+s$", "", line)
        line = re.sub(r"total \d+s", "total", line)
        if line.startswith("|"):  # a table: its last column is seconds
            line = "|".join(line.split("|")[:-2]) + "|"
        lines.append(line)
    return lines


def _run(args: list[str], out: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "memlab.app.cli", *args, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"memlab {' '.join(args[:2])} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return _printed(done.stdout, str(out))


def readings() -> dict:
    """This machine's readings of both runs."""
    with tempfile.TemporaryDirectory() as tmp:
        qs, cmp = Path(tmp) / "qs", Path(tmp) / "cmp"
        rec = {"quickstart_printed": _run(["quickstart", "--fast", "--threads", "1"], qs)}
        rec["quickstart_summary"] = _clean(json.loads((qs / "summary.json").read_text()), str(qs))
        rec["quickstart_reports"] = {
            e.name: _clean({k: r.get(k) for k in REPORT_KEYS}, str(qs))
            for e in sorted((qs / "entries").iterdir()) if (r := json.loads((e / "report.json").read_text()))}
        rec["compare_printed"] = _run(["probe", *COMPARE], cmp)
        rec["compare_curve"] = _clean(json.loads((cmp / "curve.json").read_text()), str(cmp))
        rec["compare_table"] = _printed((cmp / "curve.md").read_text(), str(cmp))
    return rec


def differences(old, new, path: str = "") -> list[str]:
    """Paths where ``new`` differs from ``old`` (values compared exactly)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}.{k}: only in {'the record' if k in old else 'this run'}" for k in set(old) ^ set(new)]
        for k in old:
            if k in new:
                out += differences(old[k], new[k], f"{path}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true", help=f"record this machine's readings in {RECORD.name}")
    args = ap.parse_args(argv)
    rec = readings()
    if args.save:
        RECORD.write_text(json.dumps(rec, indent=1) + "\n")
        print(f"recorded: {RECORD}")
        return 0
    diff = differences(json.loads(RECORD.read_text()), rec)
    for d in diff[:40]:
        print(d)
    print(f"{len(diff)} readings differ" if diff else "readings unchanged (quickstart --fast and a --compare run)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
