"""``memlab invert``, top-down: load the model -> cut the probe's chunks -> check the model applies -> take the
states -> search each chunk -> report.

The chunks are the probe's held-out chunks (:mod:`memlab.probes.chunks`): with the same ``seq_len``, ``chunk_by``,
``corpus``, split, ``seed`` and ``n_eval``, ``memlab probe`` scores the same chunk texts, and ``memlab invert``
inverts the first ``n`` of them. Each chunk is read as the probe's encoder reads it (the tokenizer's special tokens
before it, e.g. a BOS token, are the fixed prefix the search starts from).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from memlab.errors import DataError, ModelError
from memlab.flops import measure_matmul_flops
from memlab.probes.chunks import probe_chunks, probe_texts, rows, tokenize_chunks
from memlab.probes.invert.pooled import POOLS, LanguageHead, PooledOptions, PooledSearcher
from memlab.probes.invert.pooled_report import PooledReport, pooled_chunk, pooled_summary, pooled_totals
from memlab.probes.invert.positions import SearchOptions, Searcher
from memlab.probes.invert.report import build_report, chunk_result, summary_lines
from memlab.probes.invert.states import LayerReader


def machine_facts() -> dict:
    """What the timings are relative to: the CPU's bf16 flags, torch's threads and the measured matmul rate."""
    from memlab.devices import cpu_flags

    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return {"cpu_bf16_flags": flags, "threads": torch.get_num_threads(), "matmul_gflops": measure_matmul_flops(torch.device("cpu"), n=2048) / 1e9,
            "note": "GFLOP-equivalents = seconds x matmul_gflops; the cores may be shared"}


def chunk_ids(vals: dict, tokenizer) -> tuple[list[str], list[list[int]]]:
    """The first ``n`` of the probe's held-out chunks: their texts and token ids (no special tokens)."""
    n, args = vals["n"], (vals["n_eval"], vals["eval_split"], vals["corpus"], vals["seed"])
    if vals["chunk_by"] == "tokens":
        ids = probe_chunks(tokenizer, vals["seq_len"], *args, at_most=True)[:n]
        return tokenizer.batch_decode(rows(ids), skip_special_tokens=True), rows(ids)
    texts = probe_texts(vals["seq_len"], *args, at_most=True)[:n]
    ids, _ = tokenize_chunks(texts, tokenizer)
    return texts, rows(ids)


def is_causal(reader: LayerReader, ids: list[int], name: str) -> bool:
    """Whether changing the last token of ``ids`` leaves every earlier state unchanged (one ModelError line when the
    model's forward pass cannot be read from input embeddings)."""
    seq = torch.tensor([ids])  # (1, T)
    other = seq.clone()
    other[0, -1] = (other[0, -1] + 1) % reader.vocab_size
    try:
        a, b = reader.full_states(seq)[0, :-1], reader.full_states(other)[0, :-1]  # (T-1, D)
    except Exception as e:  # noqa: BLE001  (a model whose forward does not take inputs_embeds)
        raise ModelError(f"{name}: its forward pass cannot be read from input embeddings ({str(e)[:120]})") from None
    return float(((a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)).max()) <= 1e-4


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


def load(spec: str, layer: int, device: str):
    from memlab.probes.encoders import load_transformers

    enc = load_transformers(spec, layer=layer, device=device)
    return enc, LayerReader(enc.model, layer, vocab_size=len(enc.tokenizer))


def states_source(vals: dict, enc, reader: LayerReader, device: str) -> tuple[str, LayerReader]:
    """The model whose states are inverted and its reader: ``--states-from`` (same tokenizer and width) or the
    model itself."""
    if not vals["states_from"]:
        return vals["model"], reader
    src = vals["states_from"]
    other, src_reader = load(src, vals["layer"], device)
    if len(other.tokenizer) != len(enc.tokenizer) or other.dim != enc.dim:
        raise ModelError(f"--states-from {src}: its tokenizer ({len(other.tokenizer)} tokens) or width "
                         f"({other.dim}) differs from {vals['model']}'s ({len(enc.tokenizer)}, {enc.dim})")
    return src, src_reader


def setup(vals: dict):
    """Threads, device, the model and its reader, the chunks, the probe run's reading of them (``--probe``; else
    None): ``(device, enc, reader, texts, chunks, side)``."""
    from memlab.devices import resolve_device

    if vals["threads"]:
        torch.set_num_threads(vals["threads"])
    device = str(resolve_device(vals["device"]))
    enc, reader = load(vals["model"], vals["layer"], device)
    side = None
    if vals.get("probe"):  # the probe run's held-out chunks, as it cut them, and its decoder's reading of them
        from memlab.probes.invert.beside import read_probe_side  # only with --probe: the trained probe's pipeline

        side = read_probe_side(vals["probe"], vals["n"], device)
        texts, chunks = side.texts, side.ids
    else:
        texts, chunks = chunk_ids(vals, enc.tokenizer)
    if not chunks:
        raise DataError("no chunk to invert")
    return device, enc, reader, texts, chunks, side


def beside_probe(report, side, lines: list[str]) -> list[str]:
    """``report.table`` (the probe run's side by side with the inversion, :mod:`memlab.probes.invert.table`) and
    the summary lines with the table after them; the lines unchanged without a probe run."""
    if side is None:
        return lines
    from memlab.probes.invert.table import build_table, table_lines

    table = build_table(side, report.chunks, report.states, report.layer, seed=report.text.get("seed") or 0)
    report.table = table.to_dict()
    return lines + table_lines(table)


def run_invert(vals: dict, out: Path):
    """Invert the chunks ``vals`` names (the checked flags of ``memlab invert``) into ``out``; (report, summary
    lines)."""
    from memlab.outdir import OutputFolder
    from memlab.progress import progress_bar

    if vals["states"] in POOLS:
        return run_pooled(vals, out)
    if vals["cache_dir"]:
        from memlab.data.chunkcache import check_cache_dir

        check_cache_dir(vals["cache_dir"])
    device, enc, reader, texts, chunks, side = setup(vals)
    name = vals["model"]
    check_applies(reader, enc.prefix + chunks[0], name)
    src, src_reader = states_source(vals, enc, reader, device)
    opts = SearchOptions(batch_size=vals["batch_size"], budget=vals["budget"], exhaustive=vals["exhaustive"],
                         exhaustive_batch=vals["exhaustive_batch"], tol=vals["tol"], min_gap=vals["min_gap"],
                         accept_gap=vals["accept_gap"],
                         relinearize=vals["relinearize"])
    searcher = Searcher(reader, opts)
    gen = torch.Generator().manual_seed(vals["seed"])
    machine = machine_facts()
    with OutputFolder.new(out, "inversion") as folder:
        with torch.no_grad():
            targets = [observed_states(src_reader, enc.prefix, ids, vals["noise"], gen) for ids in chunks]
        table = first_table(searcher, enc.prefix, vals["cache_dir"], vals["progress"])
        bar = progress_bar(reader.vocab_size, "invert: first positions", show=vals["progress"])
        firsts = searcher.first_positions(enc.prefix, torch.stack([t[0] for t in targets]), on_batch=bar.update,
                                          table=table)
        bar.close()
        bar = progress_bar(sum(len(c) for c in chunks), "invert: positions", show=vals["progress"])
        results = []
        for i, (text, ids, tg, first) in enumerate(zip(texts, chunks, targets, firsts)):
            start = time.perf_counter()
            got = searcher.chunk(tg, enc.prefix, ids, on_position=lambda p: bar.update(), first=first)
            secs = time.perf_counter() - start + first.seconds
            results.append(chunk_result(i, text, ids, got, enc.tokenizer.decode, secs))
        bar.close()
        report = build_report(
            results, model=name, states_from=src, layer=reader.layer, num_layers=reader.num_layers,
            states=vals["states"], hooks=dict(reader.hooks),
            text={k: vals[k] for k in ("corpus", "chunk_by", "seq_len", "seed", "n_eval")}
            | {"split": vals["eval_split"], "prefix": list(enc.prefix)},
            search=vars(opts) | {"first_position": "one exhaustive pass shared by all chunks"
                                 + (", from the kept table" if table is not None else "")},
            noise=vals["noise"], machine=machine)
        lines = beside_probe(report, side, summary_lines(report))
        folder.write_json("report.json", report.to_dict())
        folder.write("summary.txt", "\n".join(lines) + "\n")
    return report, lines


def run_pooled(vals: dict, out: Path):
    """``memlab invert --states last|mean``: search every chunk from its pooled state, and the same search from the
    next chunk's pooled state (the control, scored against the true chunk); (report, summary lines)."""
    from memlab.outdir import OutputFolder
    from memlab.progress import progress_bar

    device, enc, reader, texts, chunks, side = setup(vals)
    name = vals["model"]
    prefix, suffix = list(enc.prefix), list(getattr(enc, "suffix", []) or [])
    causal = is_causal(reader, prefix + chunks[0] + suffix, name)
    src, src_reader = states_source(vals, enc, reader, device)
    head = LanguageHead.of(reader) if causal else None
    if vals["prior_weight"] and head is None:
        raise ModelError(f"--prior-weight needs a causal model whose next-token head can be read; {name} is "
                         f"{'causal without tied output embeddings' if causal else 'bidirectional'}: use "
                         "--prior-weight 0")
    opts = PooledOptions(forwards=vals["forwards"], seconds=vals["seconds"] or float("inf"),
                         batch_size=vals["batch_size"], topk=vals["topk"], restarts=vals["restarts"],
                         prior_weight=vals["prior_weight"], init=vals["init"] if head is not None else "random",
                         )
    searcher = PooledSearcher(reader, vals["states"], opts, head, prefix, suffix)
    target_of = PooledSearcher(src_reader, vals["states"], opts, None, prefix, suffix)
    gen = torch.Generator().manual_seed(vals["seed"])
    machine = machine_facts()
    with OutputFolder.new(out, "inversion") as folder:
        targets = []
        for ids in chunks:
            z = target_of.pooled(torch.tensor([ids]))[0]  # (D,)
            if vals["noise"]:
                z = z + torch.randn(z.shape, generator=gen) * (vals["noise"] * z.norm() / z.shape[-1] ** 0.5)
            targets.append(z)
        bar = progress_bar(len(chunks) * (2 if vals["control"] else 1), "invert: pooled search",
                           show=vals["progress"])
        results = []
        for i, (text, ids, z) in enumerate(zip(texts, chunks, targets)):
            got = searcher.search(z, len(ids), seed=vals["seed"] + i)
            bar.update()
            ctrl, j = None, None
            if vals["control"] and len(chunks) > 1:
                j = (i + 1) % len(chunks)
                ctrl = searcher.search(targets[j], len(ids), seed=vals["seed"] + i)
                bar.update()
            results.append(pooled_chunk(i, text, ids, got, enc.tokenizer.decode, ctrl, j))
        bar.close()
        report = PooledReport(
            model=name, states_from=src, layer=reader.layer, num_layers=reader.num_layers, states=vals["states"],
            hooks=dict(reader.hooks), text={k: vals[k] for k in ("corpus", "chunk_by", "seq_len", "seed", "n_eval")}
            | {"split": vals["eval_split"], "prefix": prefix, "suffix": suffix},
            search=vars(opts) | {"causal": causal}, noise=vals["noise"], machine=machine, prior=head is not None,
            totals=pooled_totals(results), chunks=results)
        lines = beside_probe(report, side, pooled_summary(report))
        folder.write_json("report.json", report.to_dict())
        folder.write("summary.txt", "\n".join(lines) + "\n")
    return report, lines
