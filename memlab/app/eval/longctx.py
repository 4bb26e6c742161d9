"""Information tasks: needle in a haystack (RULER style), multi-document QA (LongBench style),
and general understanding (HellaSwag, endings ranked by log-likelihood)."""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from typing import Any

from memlab.app.eval.tasks import Task, TaskOptions, bundled_sentences, load_hub, register_task, resolve_rows

NEEDLE_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the numbers afterwards.\n")
NEEDLE = "One of the special magic numbers for {key} is: {value}."
NEEDLE_QUERY = ("\nWhat is the special magic number for {key} mentioned in the provided text? "
                "The special magic number for {key} mentioned in the provided text is")
KEYS = ["harbour", "lantern", "orchard", "violin", "meadow", "compass", "thimble", "glacier", "saffron", "quarry",
        "falcon", "ember", "walnut", "tapestry", "beacon", "marble"]


def haystack_sentences() -> list[str]:
    """Filler text for haystacks: the last three chapters of each bundled Austen novel."""
    return [s for doc in bundled_sentences(min_words=6, chapters=3) for s in doc if sum(c.isalpha() for c in s) > len(s) / 2]


class Needle(Task):
    """RULER-style single needle: a key-value sentence hidden at a depth of a haystack; exact match of the value.

    Also reports ``choice_accuracy``: the true value ranked by log-likelihood against 4
    random distractor values (meaningful for small models that cannot yet answer freely).
    """

    name = "needle"
    description = "needle in a haystack (RULER niah_single): exact match of a 7-digit value, by haystack length"
    reads_data = False  # its examples are synthesized from the bundled text (--needle-lengths, --seed)

    def load(self, opts: TaskOptions) -> list[dict]:
        rng = random.Random(opts.seed)
        sents = haystack_sentences()
        rows = []
        for length in opts.needle_lengths:
            for depth in opts.needle_depths:
                key = rng.choice(KEYS)
                value = str(rng.randint(1_000_000, 9_999_999))
                distractors = [str(rng.randint(1_000_000, 9_999_999)) for _ in range(4)]
                start = rng.randrange(0, len(sents))
                rows.append({"length": length, "depth": depth, "key": key, "value": value,
                             "distractors": distractors, "start": start})
        return rows[: opts.limit] if opts.limit else rows

    @staticmethod
    def build_prompt(adapter, ex: dict, sents: list[str]) -> str:
        """Haystack of about ``ex['length']`` tokens (in the model's tokenizer) with the needle at ``ex['depth']``."""
        needle = NEEDLE.format(key=ex["key"], value=ex["value"])
        budget = ex["length"] - adapter.count_tokens(NEEDLE_INTRO + needle + NEEDLE_QUERY.format(key=ex["key"]))
        hay, used, i = [], 0, ex["start"]
        while used < budget - 4 and i < ex["start"] + 4 * len(sents):  # cycle through the text; skip long sentences
            s = sents[i % len(sents)]
            n = adapter.count_tokens(" " + s)
            if used + n <= budget:
                hay.append(s)
                used += n
            i += 1
        at = round(ex["depth"] * len(hay))
        text = " ".join(hay[:at] + [needle] + hay[at:])
        return NEEDLE_INTRO + text + NEEDLE_QUERY.format(key=ex["key"])

    def evaluate(self, adapter, examples, opts):
        sents = haystack_sentences()
        too_long = [e["length"] for e in examples if e["length"] + 16 > adapter.max_context]
        if too_long:
            from memlab.errors import MemlabError

            raise MemlabError(f"needle length {too_long[0]} does not fit {adapter.name}'s window of "
                              f"{adapter.max_context} tokens; pass smaller --needle-lengths")
        prompts = [self.build_prompt(adapter, e, sents) for e in examples]
        gens = adapter.generate(prompts, 12)
        hits = [e["value"] in g for e, g in zip(examples, gens)]
        res: dict[str, Any] = {"n": len(examples), "exact_match": sum(hits) / len(hits)}
        by_len: dict[int, list[bool]] = {}
        for e, h in zip(examples, hits):
            by_len.setdefault(e["length"], []).append(h)
        for L, hs in sorted(by_len.items()):
            res[f"exact_match@{L}"] = sum(hs) / len(hs)
        if adapter.can_score:
            ctxs, conts, owner = [], [], []
            for i, (e, p) in enumerate(zip(examples, prompts)):
                for v in [e["value"]] + e["distractors"]:
                    ctxs.append(p)
                    conts.append(" " + v + ".")
                    owner.append(i)
            scores = adapter.score(ctxs, conts)
            right = 0
            for i in range(len(examples)):
                s = [lp for (lp, _), o in zip(scores, owner) if o == i]
                right += int(max(range(len(s)), key=s.__getitem__) == 0)
            res["choice_accuracy"] = right / len(examples)
        res["samples"] = [{"length": e["length"], "depth": e["depth"], "value": e["value"], "generated": g}
                          for e, g in list(zip(examples, gens))[: opts.samples]]
        return res


# ---------------------------------------------------------------------- multi-document QA
def normalize_answer(s: str) -> str:
    """LongBench/SQuAD normalization: lower case, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def qa_f1(prediction: str, answer: str) -> float:
    """Token F1 between normalized prediction and answer."""
    p, a = normalize_answer(prediction).split(), normalize_answer(answer).split()
    common = Counter(p) & Counter(a)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(a)
    return 2 * prec * rec / (prec + rec)


QA_PROMPT = ("Answer the question based on the given passages. Only give me the answer and do not output any "
             "other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
             "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:")


class MultiDocQA(Task):
    """LongBench-style multi-document QA (HotpotQA subset on the hub): F1 and exact match, best over answers."""

    name = "multidoc_qa"
    description = "multi-document QA in the LongBench style (hotpotqa): token F1 and exact match"

    @staticmethod
    def _hub(limit):
        rows = load_hub("THUDM/LongBench", "hotpotqa", "test", limit)
        return [{"context": r["context"], "input": r["input"], "answers": list(r["answers"])} for r in rows]

    def load(self, opts: TaskOptions) -> list[dict]:
        return resolve_rows(opts.data, "multidoc_qa.jsonl", ("context", "input", "answers"), self._hub, opts.limit)

    def evaluate(self, adapter, examples, opts):
        prompts = []
        for e in examples:
            ctx = e["context"]
            room = adapter.max_context - opts.max_new_tokens - adapter.count_tokens(QA_PROMPT.format(context="", input=e["input"]))
            while ctx and adapter.count_tokens(ctx) > room:  # LongBench truncates the middle; we keep both ends
                half = int(len(ctx) * 0.45)
                ctx = ctx[:half] + " ... " + ctx[len(ctx) - half :]
            prompts.append(QA_PROMPT.format(context=ctx, input=e["input"]))
        gens = [g.strip().split("\n")[0] for g in adapter.generate(prompts, min(opts.max_new_tokens, 32))]
        f1 = [max(qa_f1(g, a) for a in e["answers"]) for e, g in zip(examples, gens)]
        em = [max(float(normalize_answer(g) == normalize_answer(a)) for a in e["answers"]) for e, g in zip(examples, gens)]
        res: dict[str, Any] = {"n": len(examples), "f1": sum(f1) / len(f1), "exact_match": sum(em) / len(em)}
        res["samples"] = [{"question": e["input"], "answers": e["answers"], "generated": g}
                          for e, g in list(zip(examples, gens))[: opts.samples]]
        return res


# ---------------------------------------------------------------------- HellaSwag
def hellaswag_preprocess(text: str) -> str:
    """As lm-evaluation-harness: drop WikiHow bracket markers, single spaces."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


class HellaSwag(Task):
    """HellaSwag: pick the ending with the highest log-likelihood (acc) or per-byte log-likelihood (acc_norm)."""

    name = "hellaswag"
    description = "HellaSwag commonsense endings ranked by LM log-likelihood (acc, acc_norm)"
    needs_scores = True

    @staticmethod
    def _hub(limit):
        rows = load_hub("Rowan/hellaswag", None, "validation", limit)
        return [{"activity_label": r["activity_label"], "ctx": r["ctx_a"] + " " + r["ctx_b"].capitalize(),
                 "endings": list(r["endings"]), "label": int(r["label"])} for r in rows]

    def load(self, opts: TaskOptions) -> list[dict]:
        return resolve_rows(opts.data, "hellaswag.jsonl", ("activity_label", "ctx", "endings", "label"), self._hub, opts.limit)

    def evaluate(self, adapter, examples, opts):
        ctxs, conts = [], []
        for e in examples:
            ctx = hellaswag_preprocess(e["activity_label"] + ": " + e["ctx"])
            for end in e["endings"]:
                ctxs.append(ctx)
                conts.append(" " + hellaswag_preprocess(end))
        scores = adapter.score(ctxs, conts)
        acc = acc_norm = 0
        k = 0
        for e in examples:
            n = len(e["endings"])
            lp = [s for s, _ in scores[k : k + n]]
            norm = [s / max(1, len(c.encode())) for s, c in zip(lp, conts[k : k + n])]
            acc += int(max(range(n), key=lp.__getitem__) == int(e["label"]))
            acc_norm += int(max(range(n), key=norm.__getitem__) == int(e["label"]))
            k += n
        return {"n": len(examples), "acc": acc / len(examples), "acc_norm": acc_norm / len(examples)}


register_task(Needle())
register_task(MultiDocQA())
register_task(HellaSwag())
