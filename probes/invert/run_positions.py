"""The per-position search in ``memlab invert``'s run (``--states positions``): the checks that it applies, the
observed states, the first-position table, and each chunk searched position by position
(:mod:`memlab.probes.invert.positions`)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from memlab.errors import ModelError
from memlab.probes.invert.positions import Searcher
from memlab.probes.invert.report import build_report, chunk_result, summary_lines
from memlab.probes.invert.setup import is_causal, states_source
from memlab.probes.invert.states import LayerReader


def check_applies(reader: LayerReader, ids: list[int], name: str) -> None:
    """One ModelError line when per-position inversion does not apply: a state that changes with later tokens
    (a bidirectional encoder), or a cached pass that does not reproduce the model's own states."""
    seq = torch.tensor([ids])  # (1, T)
    if not is_causal(reader, ids, name):
        raise ModelError(f"--states positions needs a causal model, but {name} reads its input both ways (a state "
                         f"changes with later tokens); for it use --states mean or last (a search from the pooled "
                         f"state), or the trained probe: memlab probe --model {name} --pool mean")
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


def first_table(searcher: Searcher, prefix: list[int], cache_dir: str | None, show) -> torch.Tensor | None:
    """The first-position states of every token ``(V, D)``, kept in ``cache_dir`` (a safetensors file keyed by the
    weights, the layer and the prefix) and read back by later runs; None without a ``cache_dir`` (then each run
    computes what it needs on the fly)."""
    if not cache_dir:
        return None
    from safetensors.torch import load_file, save

    from memlab.progress import progress_bar
    from memlab.rundir import write_atomic

    r = searcher.reader
    key = hashlib.sha1(f"{fingerprint(r.model)}|{r.layer}|{prefix}|{r.vocab_size}|{r.dtype}".encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"invert-first-{key}.safetensors"
    if path.is_file():
        try:
            return load_file(str(path))["states"]
        except Exception:  # noqa: BLE001  (a damaged file is computed again)
            pass
    bar = progress_bar(r.vocab_size, "invert: first-position table", show=show)
    table = searcher.first_table(prefix, on_batch=bar.update)  # (V, D)
    bar.close()
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(path, save({"states": table.contiguous()}))
    return table


class PositionsRun:
    """``--states positions`` as the run's sequence drives it (:func:`memlab.probes.invert.run.run_invert`)."""

    label = "positions"

    def __init__(self, opts, enc, reader: LayerReader, device: str, chunks: list[list[int]]):
        self.opts, self.enc, self.reader = opts, enc, reader
        check_applies(reader, enc.prefix + chunks[0], opts.model.model)
        self.src, self.src_reader = states_source(opts.model, enc, reader, device)
        self.searcher = Searcher(reader, opts.positions)
        self.gen = torch.Generator().manual_seed(opts.text.seed)
        self.table, self.firsts = None, []

    @staticmethod
    def check(opts) -> None:
        """Before the model loads: the folder of the kept first-position table can be written."""
        if opts.positions.cache_dir:
            from memlab.data.chunkcache import check_cache_dir

            check_cache_dir(opts.positions.cache_dir)

    def units(self, chunks: list[list[int]]) -> int:
        return sum(len(c) for c in chunks)

    def targets(self, chunks: list[list[int]]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [observed_states(self.src_reader, self.enc.prefix, ids, self.opts.model.noise, self.gen)
                    for ids in chunks]

    def prepare(self, targets: list[torch.Tensor]) -> None:
        """Every chunk's first position, in one exhaustive pass shared by all chunks (from the kept table when
        ``--cache-dir`` has one)."""
        from memlab.progress import progress_bar

        show = self.opts.output.progress or None
        self.table = first_table(self.searcher, self.enc.prefix, self.opts.positions.cache_dir, show)
        bar = progress_bar(self.reader.vocab_size, "invert: first positions", show=show)
        self.firsts = self.searcher.first_positions(self.enc.prefix, torch.stack([t[0] for t in targets]),
                                                    on_batch=bar.update, table=self.table)
        bar.close()

    def chunk(self, i: int, text: str, ids: list[int], targets: list[torch.Tensor], step):
        start = time.perf_counter()
        first = self.firsts[i]
        got = self.searcher.chunk(targets[i], self.enc.prefix, ids, on_position=lambda p: step(), first=first)
        secs = time.perf_counter() - start + first.seconds
        return chunk_result(i, text, ids, got, self.enc.tokenizer.decode, secs)

    def report(self, results: list, common: dict):
        from dataclasses import asdict

        return build_report(results, **common, search=asdict(self.opts.positions) | {
            "first_position": "one exhaustive pass shared by all chunks"
            + (", from the kept table" if self.table is not None else "")})

    def summary(self, report) -> list[str]:
        return summary_lines(report)
