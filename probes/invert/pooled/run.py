"""The pooled search in ``memlab invert``'s run (``--states last|mean|first|second_last|space``): each chunk
searched from its pooled state (a space's vector), and the same search from the next chunk's (the control, scored
against the true chunk) (:mod:`memlab.probes.invert.pooled.searcher`)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import torch

from memlab.errors import ConfigError, ModelError
from memlab.probes.invert.layer import LayerReader
from memlab.probes.invert.options import RELAX_METHODS
from memlab.probes.invert.pooled.correct import CorrectOptions
from memlab.probes.invert.pooled.recover import Recoverer
from memlab.probes.invert.pooled.report import PooledReport, pooled_chunk, pooled_summary, pooled_totals
from memlab.probes.invert.pooled.searcher import LOGITS, LanguageHead, PooledSearcher, blind_spot
from memlab.probes.invert.start import affixes, is_causal, machine_facts, states_source


class PooledRun:
    """A pooled ``--states`` as the run's sequence drives it (:func:`memlab.probes.invert.run.run_invert`)."""

    label = "pooled search"

    def __init__(self, opts, enc, reader, device: str, chunks: list[list[int]]):
        """``reader``: a :class:`~memlab.probes.invert.layer.LayerReader`, or for ``--states space`` a
        :class:`~memlab.probes.invert.space_reader.SpaceReader` (bidirectional, no layer, no head)."""
        self.opts, self.enc = opts, enc
        name, states = opts.model.model, opts.model.states
        self.prefix, self.suffix = affixes(enc)
        longest = max(len(c) for c in chunks)
        self.limit = limit = getattr(reader, "max_length", None)
        if limit is not None and longest > limit:
            raise ModelError(f"{name} reads chunks of at most {limit} tokens, and a chunk here has {longest}: give "
                             f"--chunk-by tokens --seq-len {limit} or less")
        causal = getattr(reader, "causal", None)  # a space says it; a transformers model is tried
        self.causal = is_causal(reader, self.prefix + chunks[0] + self.suffix, name) if causal is None else causal
        why = blind_spot(states, self.causal, self.prefix, self.suffix)
        if why is not None:
            raise ModelError(f"--states {states} cannot carry the chunk on {name}: {why}; use --states last or mean "
                             "(or positions: every position's state)")
        self.src, src_reader = states_source(opts.model, enc, reader, device)
        head = LanguageHead.of(reader) if self.causal else None
        if states == LOGITS and head is None:
            raise ModelError(f"--states logits reads a causal model's next-token distribution; {name} is "
                             f"{'causal without a readable output head' if self.causal else 'bidirectional'}: use "
                             "--states last or mean")
        if opts.pooled.prior_weight and head is None:
            raise ModelError(f"--prior-weight needs a causal model whose next-token head can be read; {name} is "
                             f"{'causal without tied output embeddings' if self.causal else 'bidirectional'}: use "
                             "--prior-weight 0")
        self.search_opts = replace(opts.pooled, init=opts.pooled.init if head is not None else "random",
                                   table_topk=0 if self.causal else opts.pooled.table_topk)
        self.head = head
        self.searcher = PooledSearcher(reader, states, self.search_opts, head, self.prefix, self.suffix)
        src_head = (head if src_reader is reader else LanguageHead.of(src_reader)) if states == LOGITS else None
        self.target_of = PooledSearcher(src_reader, states, self.search_opts, src_head, self.prefix, self.suffix)
        self.gen = torch.Generator().manual_seed(opts.text.seed)
        self.proposer_note = ""
        self.proposer_name, self.proposer = self._proposer(opts, enc, head, device)
        self.recoverer = None  # made in prepare(), once the matmul rate that turns the budget into seconds is known

    def _proposer(self, opts, enc, head, device):
        """(name, :class:`~memlab.probes.invert.pooled.propose.Proposer`) of ``--proposer`` (``auto``: the model itself
        when causal with a readable head, else smollm2); (None, None) when no stage proposes."""
        o = opts.pooled
        if o.method in ("swap", "correct", "relax", "relax-correct") or o.proposer == "none":
            return None, None
        from memlab.probes.invert.pooled.propose import ProposeOptions, Proposer

        popt = ProposeOptions(beams=o.beams, branch=o.branch, bow_weight=o.bow_weight,
                              lm_weight=o.prior_weight)
        name = o.proposer
        if name == "auto" and head is not None:
            return opts.model.model, Proposer(head, enc.tokenizer, self.prefix, enc.tokenizer, popt)
        name = "smollm2" if name == "auto" else name
        from memlab.probes.invert.options import is_space
        from memlab.probes.invert.start import load

        if is_space(name):
            raise ModelError(f"--proposer {name}: a space, not a causal language model; name a causal model memlab "
                             "loads or use --proposer none")
        try:
            lm, lm_reader = load(name, -1, device)
        except ModelError as e:
            if o.proposer != "auto" or not is_space(opts.model.model):
                raise
            # a space's default proposer: without it, the correction starts from a blank chunk
            self.proposer_note = (f"no proposer: the default, {name}, could not be loaded ({str(e)[:120]}); the "
                                  "correction started from a blank chunk")
            return None, None
        lm_head = LanguageHead.of(LayerReader(lm.model, lm_reader.num_layers))
        probe = list(lm.prefix) + lm.tokenizer("a short test", add_special_tokens=False)["input_ids"]
        if lm_head is None or not is_causal(lm_reader, probe, name):
            raise ModelError(f"--proposer {name}: not a causal model whose next-token head can be read (tied output "
                             "embeddings); name another or use --proposer none")
        return name, Proposer(lm_head, lm.tokenizer, list(lm.prefix), enc.tokenizer, popt)

    @staticmethod
    def check(opts) -> None:
        """The options checked before the model loads: the relaxation's loss against the target."""
        o = opts.pooled
        if o.method in RELAX_METHODS and o.relax_loss == "huber" and opts.model.states != LOGITS:
            raise ConfigError("--relax-loss huber compares next-token log-probabilities: it needs --states logits "
                              "(a state's relaxation descends log)")

    def units(self, chunks: list[list[int]]) -> int:
        return len(chunks) * (2 if self.opts.pooled.control and len(chunks) > 1 else 1)

    def targets(self, chunks: list[list[int]]) -> list[torch.Tensor]:
        noise, out = self.opts.model.noise, []
        for ids in chunks:
            z = self.target_of.pooled(torch.tensor([ids]))[0]  # (D,)
            if noise:
                z = z + torch.randn(z.shape, generator=self.gen) * (noise * z.norm() / z.shape[-1] ** 0.5)
            out.append(z)
        return out

    def prepare(self, targets: list[torch.Tensor], todo: list[int] | None = None, machine: dict | None = None) -> None:
        """The budget in seconds (``--gflops`` over the run's measured matmul rate, ``machine``, or ``--seconds`` if
        sooner) and the propose-correct search (unless ``--method swap``)."""
        o = self.opts.pooled
        self.rate = (machine or machine_facts())["matmul_gflops"]
        self.budget_s = min(o.seconds, o.gflops / self.rate)
        self.searcher.set_metric(None)  # the plain distance unless the correction's is whitened below
        if o.method == "swap":
            self.searcher.opt = replace(self.search_opts, seconds=self.budget_s)
            return
        copt = CorrectOptions.of(self.search_opts)
        self.table_s = 0.0
        if copt.table_topk and o.method != "propose":  # every token's pooled state alone, once for the run
            began = time.perf_counter()
            self.searcher.token_table()
            self.table_s = time.perf_counter() - began
        self.whiten_s, self.whiten_n = 0.0, 0
        if o.whiten and o.method != "propose" and self.opts.model.states != LOGITS:  # the metric, once for the run
            from memlab.probes.invert.start import train_chunk_ids

            began = time.perf_counter()
            train = [c for c in train_chunk_ids(self.opts.text, self.enc.tokenizer, o.whiten_chunks)
                     if c and (self.limit is None or len(c) <= self.limit)]  # what the encoder reads
            if len(train) >= 2:  # a corpus with no training text to speak of: the plain distance
                self.searcher.set_metric(*self.searcher.whitening(train, o.whiten))
            self.whiten_n = len(train) if len(train) >= 2 else 0
            self.whiten_s = time.perf_counter() - began
        tok = self.enc.tokenizer
        pad = next((t for t in (tok.mask_token_id, tok.pad_token_id, tok.unk_token_id) if t is not None), None)
        relaxing = o.method in RELAX_METHODS
        self.recoverer = Recoverer(self.searcher, copt, self.proposer, method="correct" if relaxing else o.method,
                                   seconds=self.budget_s, forwards=o.forwards, perturb_edits=o.perturb, pad_id=pad,
                                   propose_share=o.propose_share)
        self.relaxer = None
        if relaxing:
            from memlab.probes.invert.pooled.relax import RelaxOptions, Relaxer

            banned = sorted(set(tok.all_special_ids or []))
            self.relaxer = Relaxer(self.searcher, RelaxOptions.of(self.search_opts), banned=banned)

    def results(self, todo: list[int], texts, chunks, targets, step):
        """Each chunk of ``todo`` searched, its result yielded as it finishes: with the relaxation, ``relax_group``
        chunks (and their controls) of one length are relaxed in one batch, then each is corrected from its
        nearest projection; the other methods search chunk by chunk."""
        if self.relaxer is None:
            for i in todo:
                yield self.chunk(i, texts[i], chunks[i], targets, step)
            return
        from memlab.probes.invert.pooled.relaxed import relaxed_chunks

        yield from relaxed_chunks(self, todo, texts, chunks, targets, step)

    def chunk(self, i: int, text: str, ids: list[int], targets: list[torch.Tensor], step):
        seed = self.opts.text.seed + i
        search = self.recoverer.search if self.recoverer is not None else self.searcher.search
        got = search(targets[i], len(ids), seed=seed)
        step()
        ctrl, j = None, None
        if self.opts.pooled.control and len(targets) > 1:
            j = (i + 1) % len(targets)
            ctrl = search(targets[j], len(ids), seed=seed)
            step()
        c = pooled_chunk(i, text, ids, got, self.enc.tokenizer.decode, ctrl, j, tol=self.opts.pooled.tol)
        c.cosine = self.cosine(got.ids, targets[i])
        return c

    def cosine(self, ids: list[int], target: torch.Tensor) -> float:
        """Cosine between the pooled vector of ``ids`` and ``target`` (one forward pass)."""
        z = self.searcher.pooled(torch.tensor([ids]))[0]
        return float(torch.nn.functional.cosine_similarity(z, target.float().cpu(), dim=0))

    def report(self, results: list, common: dict):
        common = dict(common, text=common["text"] | {"suffix": self.suffix})
        extra = {"causal": self.causal, "proposer": self.proposer_name, "proposer_note": self.proposer_note,
                 "budget_seconds": self.budget_s,
                 "token_table_seconds": getattr(self, "table_s", 0.0),
                 "whitening_seconds": getattr(self, "whiten_s", 0.0),
                 "whitening_chunks": getattr(self, "whiten_n", 0)}
        if self.relaxer is not None:  # the loss it descended (auto resolved)
            extra["relax_loss"] = self.relaxer.loss
        return PooledReport(**common, search=asdict(self.search_opts) | extra,
                            prior=self.head is not None, totals=pooled_totals(results), chunks=results)

    def summary(self, report) -> list[str]:
        return pooled_summary(report)
