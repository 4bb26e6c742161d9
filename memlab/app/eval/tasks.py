"""Evaluation tasks (registered in ``memlab.registry.TASKS``) and their data sources.

Every task has ``load(data, limit) -> examples`` and ``evaluate(adapter, examples, opts) -> dict``.
``data`` is one of:

- ``None`` / ``"local"``: the task's small local set (``memlab/resources/eval/<file>.jsonl``,
  shipped in the package) or, for next-sentence and needle tasks, text from the bundled Austen corpus;
- ``"hub"``: the public dataset through ``datasets`` (needs a network);
- a path to a ``.jsonl`` file with the task's fields.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from memlab.errors import DataError, MemlabError
from memlab.paths import resource
from memlab.registry import TASKS

LOCAL_DIR = resource("eval")
"""The small local task sets (package data)."""


@dataclass
class TaskOptions:
    """Options shared by the tasks (``memlab eval`` flags)."""

    data: str | None = None
    """Data source: None/'local', 'hub', or a .jsonl path."""
    limit: int | None = None
    """Evaluate at most this many examples."""
    max_new_tokens: int = 48
    """Generation budget per example."""
    seed: int = 0
    """Seed for synthesized examples (needle positions, keys)."""
    needle_lengths: tuple[int, ...] = (256, 448)
    """Needle task: haystack lengths in tokens (each must fit the model's window)."""
    needle_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    """Needle task: where the needle sits, as a fraction of the haystack."""
    judge_url: str | None = None
    """OpenAI-compatible endpoint for the LLM judge (off when None)."""
    judge_model: str = "gpt-4o"
    """Model name sent to the judge endpoint."""
    samples: int = 3
    """How many example generations to keep in the results."""


def read_jsonl(path: str | Path, fields: tuple[str, ...]) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"task data not found: {p}")
    rows = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"{p}:{i + 1}: not a JSON object") from None
        missing = [f for f in fields if f not in row]
        if missing:
            raise DataError(f"{p}:{i + 1}: missing field '{missing[0]}' (needs {', '.join(fields)})")
        rows.append(row)
    if not rows:
        raise DataError(f"{p}: no examples")
    return rows


def load_hub(name: str, config: str | None, split: str, limit: int | None) -> list[dict]:
    """Rows of a public dataset via ``datasets`` (a clear error offline)."""
    import datasets

    sl = f"{split}[:{limit}]" if limit else split
    try:
        ds = datasets.load_dataset(name, config, split=sl)
    except Exception as e:  # offline, gated or script-based datasets
        raise DataError(f"could not load '{name}'{f' ({config})' if config else ''} through datasets "
                        f"({e.__class__.__name__}: {str(e).splitlines()[0][:160]}); use --data local or a .jsonl file") from None
    return [dict(r) for r in ds]


def resolve_rows(data: str | None, local_file: str, fields: tuple[str, ...], hub, limit: int | None) -> list[dict]:
    """Rows from a local set, the hub (``hub()`` -> rows) or a .jsonl path, cut to ``limit``."""
    if data in (None, "local"):
        path = LOCAL_DIR / local_file
        if not path.is_file():
            raise DataError(f"no local set {local_file} in {LOCAL_DIR}; use --data hub or a .jsonl file")
        rows = read_jsonl(path, fields)
    elif data == "hub":
        rows = hub(limit)
    else:
        rows = read_jsonl(data, fields)
    return rows[:limit] if limit else rows


@lru_cache(maxsize=4)
def bundled_sentences(min_words: int = 4, chapters: int = 1) -> tuple[tuple[str, ...], ...]:
    """Sentences of the last ``chapters`` chapters of each bundled Austen novel, one tuple per novel."""
    from memlab.data.corpus import load_corpus, split_chapters
    from memlab.data.views import split_sentences

    out = []
    for doc in load_corpus("austen"):
        text = " ".join(c.text for c in split_chapters(doc)[-chapters:])
        sents = [" ".join(s.split()) for s in split_sentences(text)]
        out.append(tuple(s for s in sents if len(s.split()) >= min_words))
    return tuple(out)


def first_sentence(text: str) -> str:
    from memlab.data.views import split_sentences

    text = text.strip()
    sents = split_sentences(text) if text else []
    return sents[0].strip() if sents else text


def generation_metrics(hyps: list[str], refs: list[str], prefix: str = "") -> dict[str, float]:
    from memlab.metrics import text_metrics

    return {f"{prefix}{k}": v for k, v in text_metrics(hyps, refs).items()}


class Task:
    """Base class: a name, a one-line description, ``load`` and ``evaluate``."""

    name = ""
    description = ""
    needs_scores = False
    """True when the task ranks options by log-likelihood: the runner gives it only adapters whose
    ``can_score`` is True (others get an error entry)."""
    reads_data = True
    """False for a task that makes its own examples: ``--data`` other than 'local' is refused for it."""

    def load(self, opts: TaskOptions) -> list[dict]:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, adapter, examples: list[dict], opts: TaskOptions) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


def register_task(task: Task) -> Task:
    TASKS.register(task.name, task, description=task.description)
    return task


class NextSentence(Task):
    """Continue a passage: metrics on the first generated sentence and on the whole continuation."""

    name = "next_sentence"
    description = "continue a passage; BLEU/ROUGE-L/METEOR on the first sentence and the whole continuation"

    def load(self, opts: TaskOptions) -> list[dict]:
        if opts.data not in (None, "local"):
            return resolve_rows(opts.data, "", ("context", "continuation"), self._hub, opts.limit)
        rows = []
        for sents in bundled_sentences():  # passages of 4 sentences, continued by the next 2
            for i in range(0, len(sents) - 6, 6):
                rows.append({"context": " ".join(sents[i : i + 4]), "continuation": " ".join(sents[i + 4 : i + 6])})
        random.Random(0).shuffle(rows)
        return rows[: opts.limit or 24]

    @staticmethod
    def _hub(limit):
        rows = load_hub("roneneldan/TinyStories", None, "validation", limit)
        out = []
        for r in rows:
            from memlab.data.views import split_sentences

            s = split_sentences(" ".join(r["text"].split()))
            if len(s) >= 3:
                k = max(1, len(s) // 3)
                out.append({"context": " ".join(s[:k]), "continuation": " ".join(s[k:])})
        return out

    def evaluate(self, adapter, examples, opts):
        gens = adapter.generate([e["context"] + " " for e in examples], opts.max_new_tokens)
        refs = [e["continuation"] for e in examples]
        res = {"n": len(examples)}
        res.update(generation_metrics([first_sentence(g) for g in gens], [first_sentence(r) for r in refs], "first_"))
        res.update(generation_metrics([g.strip() or "-" for g in gens], refs, "full_"))
        if opts.judge_url:
            from memlab.app.eval.judge import judge_texts

            res.update(judge_texts([e["context"] for e in examples], gens, opts.judge_url, opts.judge_model))
        res["samples"] = [{"context": e["context"][-200:], "generated": g, "reference": r}
                          for e, g, r in list(zip(examples, gens, refs))[: opts.samples]]
        return res


class Summarization(Task):
    """Summarize a document; ROUGE-L, METEOR and BLEU against the reference summary."""

    def __init__(self, name: str, hub: tuple[str, str | None, str, str, str], description: str):
        self.name, self.hub, self.description = name, hub, description

    def _hub(self, limit):
        name, config, split, doc_f, sum_f = self.hub
        return [{"document": r[doc_f], "summary": r[sum_f]} for r in load_hub(name, config, split, limit)]

    def load(self, opts: TaskOptions) -> list[dict]:
        return resolve_rows(opts.data, "summarization.jsonl", ("document", "summary"), self._hub, opts.limit)

    def evaluate(self, adapter, examples, opts):
        prompts = []
        for e in examples:  # keep the prompt inside the window: cut the document's end
            doc = " ".join(e["document"].split())
            words = doc.split()
            while words and adapter.count_tokens(" ".join(words)) > adapter.max_context - opts.max_new_tokens - 16:
                words = words[: int(len(words) * 0.8)]
            prompts.append(" ".join(words) + "\nSummary:")
        gens = [g.strip().split("\n")[0] or "-" for g in adapter.generate(prompts, opts.max_new_tokens)]
        refs = [" ".join(e["summary"].split()) for e in examples]
        res: dict[str, Any] = {"n": len(examples), **generation_metrics(gens, refs)}
        res["samples"] = [{"generated": g, "reference": r} for g, r in list(zip(gens, refs))[: opts.samples]]
        return res


register_task(NextSentence())
register_task(Summarization("xsum", ("EdinburghNLP/xsum", None, "test", "document", "summary"),
                            "abstractive summarization (XSum through datasets; local set offline)"))
register_task(Summarization("cnn_dailymail", ("abisee/cnn_dailymail", "3.0.0", "test", "article", "highlights"),
                            "extractive-leaning summarization (CNN/DailyMail through datasets; local set offline)"))

def get_task(name: str) -> Task:
    """The registered task ``name`` (importing :mod:`memlab.app.eval` registers them all)."""
    task = TASKS.get(name)
    if not isinstance(task, Task):
        raise MemlabError(f"task '{name}' is not an evaluation task object")
    return task
