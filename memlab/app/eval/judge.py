"""An optional LLM judge (off by default): an OpenAI-compatible chat endpoint scores each
generated story continuation 1-10 on grammar, creativity, consistency and plot, as in the
SONAR-LLM and TinyStories evaluations.

Nothing is sent anywhere unless the user passes ``--judge-url``; the API key, if any, is read
from the environment variable ``MEMLAB_JUDGE_API_KEY`` (never stored in results).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from statistics import mean

from memlab.errors import MemlabError

ASPECTS = ("grammar", "creativity", "consistency", "plot")

JUDGE_PROMPT = (
    "The following exercise asks a student to continue a story. The story's beginning is:\n\n{context}\n\n"
    "The student's continuation is:\n\n{continuation}\n\n"
    "Grade the continuation from 1 to 10 on grammar, creativity, consistency with the beginning, and whether the "
    "plot makes sense. Reply with a JSON object only, e.g. "
    '{{"grammar": 7, "creativity": 5, "consistency": 6, "plot": 6}}.'
)


def parse_scores(text: str) -> dict[str, float]:
    """The four aspect scores from a judge's reply (a JSON object, possibly inside prose)."""
    m = re.search(r"\{.*?\}", text, flags=re.S)
    if not m:
        raise MemlabError(f"the judge's reply holds no JSON object: {text[:120]!r}")
    try:
        obj = json.loads(m.group(0))
    except json.JSONDecodeError:
        raise MemlabError(f"the judge's reply is not valid JSON: {m.group(0)[:120]!r}") from None
    out = {}
    for a in ASPECTS:
        if a not in obj:
            raise MemlabError(f"the judge's reply lacks '{a}': {obj}")
        v = float(obj[a])
        if not 0 <= v <= 10:
            raise MemlabError(f"the judge's '{a}' score {v} is outside 0-10")
        out[a] = v
    return out


def ask(url: str, model: str, prompt: str, timeout: float = 60.0) -> str:
    """One chat completion from an OpenAI-compatible endpoint (``{url}/chat/completions``)."""
    body = json.dumps({"model": model, "temperature": 0.0,
                       "messages": [{"role": "user", "content": prompt}]}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("MEMLAB_JUDGE_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            reply = json.loads(r.read().decode())
    except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
        raise MemlabError(f"the judge endpoint {url} failed: {e}") from None
    try:
        return reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise MemlabError(f"the judge endpoint {url} replied without choices[0].message.content") from None


def judge_texts(contexts: list[str], continuations: list[str], url: str, model: str = "gpt-4o") -> dict[str, float]:
    """Mean judge scores ``judge_grammar`` ... ``judge_plot`` over the pairs."""
    if len(contexts) != len(continuations) or not contexts:
        raise MemlabError("the judge needs equal, non-empty lists of contexts and continuations")
    per = [parse_scores(ask(url, model, JUDGE_PROMPT.format(context=c, continuation=g)))
           for c, g in zip(contexts, continuations)]
    return {f"judge_{a}": mean(p[a] for p in per) for a in ASPECTS}
