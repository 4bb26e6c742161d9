"""Proposals of text for a pooled state: a causal language model continues beams, the encoder keeps the nearest.

The zero-shot loop of embedding inversion without training: ``beams`` texts grow a token at a time; each beam's
``branch`` most likely next tokens under the language model (any causal model memlab loads; its tokenizer may
differ from the encoder's) give ``beams * branch`` texts, each re-tokenised by the encoder's tokenizer and pooled
by the encoder; the ``beams`` nearest to the target survive. A text is done once it holds the chunk's ``T``
encoder tokens; the proposal is the nearest done text, cut to ``T`` tokens (when none is done within
``steps`` steps or the budget: the nearest text, continued greedily by the language model).

With ``bow_weight > 0`` the language model's log-probabilities are biased toward the tokens the target vector
favours: each language-model token is mapped to the encoder token its text starts with, and gets
``bow_weight`` times the standardised first-order score of that encoder token (the gradient of the distance with
respect to the one-hot input of a pad position, the best over positions: a bag-of-words estimate read from the
target without any training).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch


@dataclass
class ProposeOptions:
    """How text is proposed (the pooled search's proposal step)."""

    beams: int = 8
    """Texts kept after each step (the nearest to the target)."""
    branch: int = 32
    """Next tokens proposed per beam (the language model's most likely)."""
    bow_weight: float = 0.0
    """Bias of the proposals toward the tokens the target's first-order scores favour (0: off)."""
    lm_weight: float = 0.0
    """Weight of the language model's log-probability (nats per token) beside the distance in the beam ranking."""


@dataclass
class Proposal:
    ids: list[int]
    """The encoder's tokens of the nearest text, cut or padded to ``T``."""
    text: str
    distance: float
    forwards: int
    """Encoder forwards spent (the language model's passes are counted in seconds, not here)."""
    lm_tokens: int
    """Language-model token positions run (a measure of its cost)."""


class Proposer:
    """Beams of a causal language model's text ranked by an encoder's pooled distance to a target."""

    def __init__(self, head, lm_tokenizer, lm_prefix: list[int], enc_tokenizer, opt: ProposeOptions):
        self.head, self.lm_tok, self.enc_tok, self.opt = head, lm_tokenizer, enc_tokenizer, opt
        start = lm_tokenizer.bos_token_id if lm_tokenizer.bos_token_id is not None else lm_tokenizer.eos_token_id
        self.lm_prefix = list(lm_prefix) or [start if start is not None else 0]  # the text starts after these
        self._first: torch.Tensor | None = None

    def first_encoder_token(self) -> torch.Tensor:
        """For every language-model token, the encoder token its text starts with (``-1``: none) ``(V_lm,)``."""
        if self._first is None:
            v = self.head.weight.shape[0]
            texts = self.lm_tok.convert_ids_to_tokens(list(range(v)))
            words = [self.lm_tok.convert_tokens_to_string([t]) if t is not None else "" for t in texts]
            enc = self.enc_tok(words, add_special_tokens=False)["input_ids"]
            self._first = torch.tensor([e[0] if e else -1 for e in enc])  # (V_lm,)
        return self._first

    @torch.no_grad()
    def _next_logprobs(self, seqs: list[list[int]]) -> torch.Tensor:
        """Next-token log-probabilities ``(B, V_lm)`` after each sequence (left-padded to one length)."""
        n = max(len(s) for s in seqs)
        if all(len(s) == n for s in seqs):
            h = self.head.top.full_states(torch.tensor(seqs))[:, -1]  # (B, D)
        else:
            h = torch.stack([self.head.top.full_states(torch.tensor([s]))[0, -1] for s in seqs])  # (B, D)
        if self.head.norm is not None:
            h = self.head.norm(h.to(self.head.top.dtype)).float()
        return torch.log_softmax(h @ self.head.weight.float().T, -1)  # (B, V_lm)

    def propose(self, searcher, target: torch.Tensor, length: int, bow: torch.Tensor | None = None,
                steps: int | None = None, forwards: int = 10**9, deadline: float = math.inf) -> Proposal | None:
        """The nearest text of ``length`` encoder tokens to ``target`` ``(D,)``; ``searcher`` pools encoder ids
        (``objective(ids (B, t), target)``); ``bow`` ``(V_enc,)``: the encoder tokens' first-order scores (lower is
        better) for the bias; None when no text was proposed. At most ``forwards`` encoder forwards (one kept for
        the fallback) and no new step after ``deadline`` (``time.perf_counter()``)."""
        o = self.opt
        steps = steps or length + 6
        bias = None
        if bow is not None and o.bow_weight:
            first = self.first_encoder_token()
            s = -bow.float()
            s = (s - s.mean()) / s.std().clamp_min(1e-12)
            bias = torch.where(first >= 0, s[first.clamp_min(0)], torch.zeros(())) * o.bow_weight  # (V_lm,)
        beams: list[tuple[list[int], float]] = [([], 0.0)]  # (lm tokens after the prefix, lm log-probability)
        best = (math.inf, None, "")  # (distance, encoder ids, text) of the nearest done text
        nearest, nearest_seq = (math.inf, None, ""), []  # of any text (for the fallback), and its model tokens
        spent = lm_tokens = 0
        for _ in range(steps):
            if forwards - spent < 2 or time.perf_counter() >= deadline:
                break
            lp = self._next_logprobs([self.lm_prefix + b for b, _ in beams])  # (B, V_lm)
            lm_tokens += sum(len(self.lm_prefix) + len(b) for b, _ in beams)
            ranked = lp if bias is None else lp + bias
            top = ranked.topk(o.branch, dim=-1).indices  # (B, branch)
            cands, lps, texts, encs = [], [], [], []
            for bi, (b, blp) in enumerate(beams):
                for v in top[bi].tolist():
                    seq = b + [v]
                    text = self.lm_tok.decode(seq, skip_special_tokens=True)
                    e = self.enc_tok(text, add_special_tokens=False)["input_ids"][:length]
                    if not e:
                        continue
                    cands.append(seq), lps.append(blp + float(lp[bi, v])), texts.append(text), encs.append(e)
            room = forwards - 1 - spent
            if len(cands) > room:  # the budget's last forwards: the language model's likeliest first
                keep = sorted(range(len(cands)), key=lambda i: -lps[i])[:room]
                cands, lps, texts, encs = ([x[i] for i in keep] for x in (cands, lps, texts, encs))
            if not cands:
                break
            dist = torch.full((len(cands),), math.inf)
            by_len: dict[int, list[int]] = {}
            for i, e in enumerate(encs):
                by_len.setdefault(len(e), []).append(i)
            for n, idx in by_len.items():
                _, d = searcher.objective(torch.tensor([encs[i] for i in idx]), target)  # (b,)
                dist[idx] = d
                spent += len(idx)
            rank = dist - o.lm_weight * torch.tensor(lps) / torch.tensor([len(c) for c in cands])
            order = rank.argsort().tolist()
            for i in order:
                if len(encs[i]) == length and float(dist[i]) < best[0]:
                    best = (float(dist[i]), encs[i], texts[i])
                if float(dist[i]) < nearest[0]:
                    nearest, nearest_seq = (float(dist[i]), encs[i], texts[i]), cands[i]
            beams = [(cands[i], lps[i]) for i in order if len(encs[i]) < length][: o.beams]
            if not beams:
                break
        if nearest[1] is None:  # no step ran (no budget, or no text the encoder's tokenizer reads)
            return None
        if best[1] is None:  # nothing reached the length: the nearest text, continued greedily by the model
            d, e, text = nearest
            seq = nearest_seq
            for _ in range(2 * length):
                if len(e) >= length:
                    break
                lp = self._next_logprobs([self.lm_prefix + seq])[0]  # (V_lm,)
                seq = seq + [int(lp.argmax())]
                lm_tokens += len(self.lm_prefix) + len(seq)
                text = self.lm_tok.decode(seq, skip_special_tokens=True)
                e = self.enc_tok(text, add_special_tokens=False)["input_ids"][:length] or e
            e = (e + [e[-1]] * length)[:length]  # still short: its own last token repeated
            _, dd = searcher.objective(torch.tensor([e]), target)
            spent += 1
            best = (float(dd[0]), e, text)
        return Proposal(list(best[1]), best[2], best[0], spent, lm_tokens)
