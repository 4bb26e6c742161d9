"""The per-position search in ``memlab invert``'s run (``--states positions``): the checks that it applies, the
observed states, the first-position table (kept and checked), and the chunks searched position by position, many
at a time (:mod:`memlab.probes.invert.positions.lockstep`), each result handed on as its chunk finishes."""

from __future__ import annotations

import hashlib

import torch

from memlab.errors import ModelError
from memlab.probes.invert.head import own_head
from memlab.probes.invert.positions.lockstep import Lockstep
from memlab.probes.invert.positions.searcher import Searcher
from memlab.probes.invert.report import build_report, chunk_result, summary_lines
from memlab.probes.invert.start import is_causal, states_source
from memlab.probes.invert.layer import LayerReader


def check_applies(reader: LayerReader, ids: list[int], name: str) -> None:
    """One ModelError line when per-position inversion does not apply: a state that changes with later tokens
    (a bidirectional encoder), or a cached pass that does not reproduce the model's own states."""
    seq = torch.tensor([ids])  # (1, T)
    if not is_causal(reader, ids, name):
        raise ModelError(f"--states positions needs a causal model, but {name} reads its input both ways (a state "
                         f"changes with later tokens); for it use --states mean, first, last or second_last (a search "
                         f"from the pooled state), or the trained probe: memlab probe --model {name} --pool mean")
    try:
        prefix = reader.start([])
        cached = torch.stack([reader.extend(prefix, t) for t in ids])  # (T, D)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"{name}: its blocks cannot be run with a key-value cache ({str(e)[:120]}); per-position "
                         "inversion needs one") from None
    full = reader.full_states(seq)[0]  # (T, D)
    err = float(((cached - full).norm(dim=-1) / full.norm(dim=-1).clamp_min(1e-30)).max())
    if err > 1e-4:
        raise ModelError(f"{name}: the cached pass through the first {reader.layer} blocks does not reproduce the "
                         f"model's states (relative difference {err:.2g}); per-position inversion needs it")


def observed_states(reader: LayerReader, prefix: list[int], ids: list[int], noise: float,
                    gen: torch.Generator) -> torch.Tensor:
    """The states ``(T, D)`` of a chunk's positions at the layer (after the fixed ``prefix``), with Gaussian noise
    whose expected norm is ``noise`` times each state's norm."""
    h = reader.full_states(torch.tensor([prefix + ids]))[0, len(prefix):].cpu()  # (T, D)
    if noise:
        eps = torch.randn(h.shape, generator=gen)  # (T, D)
        h = h + eps * (noise * h.norm(dim=-1, keepdim=True) / h.shape[-1] ** 0.5)
    return h


def fingerprint(model: torch.nn.Module) -> str:
    """A short digest of a model's weights (each tensor's name, shape, sum and first values): what a kept
    first-position table depends on besides the layer and the prefix."""
    h = hashlib.sha1()
    for name, p in model.state_dict().items():
        flat = p.detach().flatten().float()
        h.update(f"{name}{tuple(p.shape)}{float(flat.double().sum()):.9g}".encode())
        h.update(flat[:16].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def table_key(reader: LayerReader, prefix: list[int]) -> str:
    """What a kept first-position table depends on: the weights, the layer, the prefix, the vocabulary, the dtype."""
    return f"{fingerprint(reader.model)}|{reader.layer}|{prefix}|{reader.vocab_size}|{reader.dtype}"


def first_table(searcher: Searcher, prefix: list[int], cache_dir: str | None, show) -> torch.Tensor | None:
    """The first-position states of every token ``(V, D)``, kept in ``cache_dir`` with the sha256 of its bytes and
    of its key (:mod:`memlab.probes.invert.positions.firsttable`) and read back, checked, by later runs (a mismatch: one
    warning, and it is computed again); None without a ``cache_dir`` (then each run computes what it needs on the
    fly)."""
    if not cache_dir:
        return None
    from memlab.probes.invert.positions.firsttable import read_table, table_path, write_table
    from memlab.progress import progress_bar

    r = searcher.reader
    key = table_key(r, prefix)
    path = table_path(cache_dir, key)
    table = read_table(path, key)
    if table is not None:
        return table
    bar = progress_bar(r.vocab_size, "invert: first-position table", show=show)
    table = searcher.first_table(prefix, on_batch=bar.update)  # (V, D)
    bar.close()
    write_table(path, key, table)
    return table


class PositionsRun:
    """``--states positions`` as the run's sequence drives it (:func:`memlab.probes.invert.run.run_invert`)."""

    label = "positions"

    def __init__(self, opts, enc, reader: LayerReader, device: str, chunks: list[list[int]]):
        self.opts, self.enc, self.reader = opts, enc, reader
        check_applies(reader, enc.prefix + chunks[0], opts.model.model)
        self.src, self.src_reader = states_source(opts.model, enc, reader, device)
        own = own_head(opts.model.model, reader) if opts.positions.prior else None
        self.lockstep = Lockstep(reader, opts.positions, head_weight=own)
        self.searcher = self.lockstep.first
        self.gen = torch.Generator().manual_seed(opts.text.seed)
        self.table, self.firsts, self.floors = None, {}, None

    @staticmethod
    def check(opts) -> None:
        """Before the model loads: the folder of the kept first-position table can be written."""
        if opts.positions.cache_dir:
            from memlab.data.chunkcache import check_cache_dir

            check_cache_dir(opts.positions.cache_dir)

    def units(self, chunks: list[list[int]]) -> int:
        return sum(len(c) for c in chunks)

    def targets(self, chunks: list[list[int]]) -> list[torch.Tensor]:
        """Each chunk's observed states as read at ``--states-dtype``, and (``self.floors``) their noise floors
        (:mod:`memlab.probes.invert.positions.precision`)."""
        from memlab.probes.invert.positions.precision import noise_floor, read_as

        dtype = self.opts.positions.states_dtype
        with torch.no_grad():
            got = [read_as(observed_states(self.src_reader, self.enc.prefix, ids, self.opts.model.noise, self.gen),
                           dtype) for ids in chunks]
        self.floors = [noise_floor(t, dtype) for t in got]  # each (T_i,)
        return got

    def prepare(self, targets: list[torch.Tensor], todo: list[int], machine: dict | None = None) -> None:
        """The first position of the chunks ``todo`` after an empty prefix (a model that reads no BOS): with
        ``--cache-dir``, one exhaustive pass shared by them, read off the kept table (built and kept the first
        time); without, shared rounds in a ranked order (:mod:`memlab.probes.invert.positions.firstranked`). After
        a BOS nothing is shared: the first position is searched as any other. ``machine`` is not read here."""
        from memlab.progress import progress_bar

        self.firsts = {}
        if self.enc.prefix or not todo:
            return
        show = self.opts.output.progress or None
        firsts = torch.stack([targets[i][0] for i in todo])
        floors = torch.stack([self.floors[i][0] for i in todo])
        self.table = first_table(self.searcher, self.enc.prefix, self.opts.positions.cache_dir, show)
        bar = progress_bar(self.reader.vocab_size, "invert: first positions", show=show)
        if self.table is None:
            from memlab.probes.invert.positions.firstranked import first_prior, first_ranked

            prior = first_prior(self.lockstep.head, self.enc.tokenizer, self.reader.vocab_size)
            got = first_ranked(self.searcher, self.enc.prefix, firsts, prior, floors, on_batch=bar.update)
        else:
            got = self.searcher.first_positions(self.enc.prefix, firsts, on_batch=bar.update, table=self.table,
                                                floors=floors)
        bar.close()
        self.firsts = dict(zip(todo, got))

    def results(self, todo: list[int], texts: list[str], chunks: list[list[int]], targets: list[torch.Tensor],
                step):
        """The chunks ``todo`` searched ``chunk_batch`` at a time in lockstep; each :class:`ChunkResult` yielded as
        its chunk finishes."""
        size = self.opts.positions.chunk_batch
        for g in range(0, len(todo), size):
            group = todo[g : g + size]
            firsts = [self.firsts[i] for i in group] if self.firsts else None
            for j, ps in self.lockstep.finished([targets[i] for i in group], self.enc.prefix,
                                                [chunks[i] for i in group], firsts, on_position=lambda p: step(),
                                                floors=[self.floors[i] for i in group]):
                i = group[j]
                yield chunk_result(i, texts[i], chunks[i], ps, self.enc.tokenizer.decode, sum(p.seconds for p in ps))

    def report(self, results: list, common: dict):
        from dataclasses import asdict

        first = ("after the prefix: searched as any other position" if self.enc.prefix else
                 "one exhaustive pass shared by all chunks, from the kept table" if self.table is not None else
                 "ranked rounds shared by all chunks (the model's prior of first tokens, the secant order)")
        return build_report(results, **common, vocab_size=self.reader.vocab_size,
                            states_dtype=self.opts.positions.states_dtype,
                            search=asdict(self.opts.positions) | {"first_position": first,
                                                                  "prior": self.lockstep.head is not None})

    def summary(self, report) -> list[str]:
        return summary_lines(report)
