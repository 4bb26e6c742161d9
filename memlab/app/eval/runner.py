"""Run tasks on one or more trained models and write one comparison table.

``results = {model_label: {task: {metric: value, ..., "samples": [...]}}}``; the run
directory gets ``eval.json`` (everything) and ``eval.md`` (the table).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError
from memlab.outdir import OutputFolder
from memlab.app.eval.tasks import TaskOptions, get_task
from memlab.tables import markdown_table


def evaluate_models(adapters: list, task_names: list[str], opts: TaskOptions, log=print) -> dict[str, Any]:
    """Every task on every adapter; a task that a model cannot run is recorded as an error, not fatal."""
    tasks = [get_task(n) for n in task_names]
    examples = {t.name: t.load(opts) for t in tasks}
    results: dict[str, Any] = {}
    for ad in adapters:
        row: dict[str, Any] = {}
        for t in tasks:
            t0 = time.perf_counter()
            try:
                if t.needs_scores and not ad.can_score:
                    raise MemlabError(f"task '{t.name}' ranks by log-likelihood and {ad.name} cannot score")
                row[t.name] = t.evaluate(ad, examples[t.name], opts)
            except MemlabError as e:
                row[t.name] = {"error": str(e)}
            row[t.name]["seconds"] = round(time.perf_counter() - t0, 2)
            log(f"{ad.name} {t.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in row[t.name].items()
                                                      if isinstance(v, float) and k != "seconds"))
        results[ad.name] = row
    return results


def format_table(results: dict[str, Any]) -> str:
    """Markdown: one row per model, one column per task metric (errors shown as '-')."""
    cols: list[tuple[str, str]] = []
    for row in results.values():
        for task, m in row.items():
            for k, v in m.items():
                if isinstance(v, (int, float)) and k not in ("n", "seconds") and (task, k) not in cols:
                    cols.append((task, k))
    lines = []
    for name, row in results.items():
        cells = [name]
        for t, k in cols:
            v = row.get(t, {}).get(k)
            cells.append(f"{v:.4g}" if isinstance(v, (int, float)) else "-")
        lines.append(cells)
    return markdown_table(["model", *(f"{t}/{k}" for t, k in cols)], lines)


def write_results(results: dict[str, Any], out: OutputFolder | str | Path, command: str = "") -> Path:
    """``eval.json`` and ``eval.md``, each written whole, into the eval's folder (a path: a new folder claimed
    here, refused when it holds files)."""
    if not isinstance(out, OutputFolder):
        with OutputFolder.new(out, "eval") as folder:
            return write_results(results, folder, command)
    path = out.write_json("eval.json", {"command": command, "results": results})
    out.write("eval.md", (f"`{command}`\n\n" if command else "") + format_table(results) + "\n")
    return path
