"""What both searches of ``memlab invert`` start from: the model and its layer reader, the probe's chunks, the
model the states come from, and the machine's facts the timings are relative to."""

from __future__ import annotations

import torch

from memlab.errors import DataError, ModelError
from memlab.flops import measure_matmul_flops
from memlab.probes.chunks.cut import probe_chunks, probe_texts, tokenize_chunks
from memlab.probes.chunks.batch import rows
from memlab.probes.invert.layer import LayerReader


def machine_facts() -> dict:
    """What the timings are relative to: the CPU's bf16 flags, torch's threads and the measured matmul rate."""
    from memlab.devices import cpu_flags

    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return {"cpu_bf16_flags": flags, "threads": torch.get_num_threads(),
            "matmul_gflops": measure_matmul_flops(torch.device("cpu"), n=2048) / 1e9,
            "note": "GFLOP-equivalents = seconds x matmul_gflops; the cores may be shared"}


def chunk_ids(text, tokenizer) -> tuple[list[str], list[list[int]]]:
    """The first ``text.n`` of the probe's held-out chunks (``text``: the run's
    :class:`~memlab.probes.invert.options.TextOptions`): their texts and token ids (no special tokens)."""
    n, args = text.n, (text.n_eval, text.eval_split, text.corpus, text.seed)
    if text.chunk_by == "tokens":
        ids = probe_chunks(tokenizer, text.seq_len, *args, at_most=True)[:n]
        return tokenizer.batch_decode(rows(ids), skip_special_tokens=True), rows(ids)
    texts = probe_texts(text.seq_len, *args, at_most=True)[:n]
    ids, _ = tokenize_chunks(texts, tokenizer)
    return texts, rows(ids)


def train_chunk_ids(text, tokenizer, n: int) -> list[list[int]]:
    """``n`` chunks cut as the run's (``text``: its :class:`~memlab.probes.invert.options.TextOptions`) from the
    corpus's training split, the probe's training chunks, in ``tokenizer`` (no special tokens): text like the
    targets', never the held-out chunks themselves."""
    args = (n, "train", text.corpus, text.seed)
    if text.chunk_by == "tokens":
        return rows(probe_chunks(tokenizer, text.seq_len, *args, at_most=True))
    return rows(tokenize_chunks(probe_texts(text.seq_len, *args, at_most=True), tokenizer)[0])


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


def load(spec: str, layer: int | None, device: str, device_map: str | None = None):
    """The encoder memlab loads for ``spec`` and a reader of its states at ``layer`` (``device_map``: accelerate's
    placement, :mod:`memlab.probes.encoders.placement`); for a space (``space:NAME:ARG``, :func:`is_space`), the probe's
    ``SpaceEncoder`` and a :class:`~memlab.probes.invert.space_reader.SpaceReader` of its vector (one ModelError
    line for a space that has no encoder to search with)."""
    from memlab.probes.invert.options import is_space

    if is_space(spec):
        from memlab.probes.encoders.sources import load_space
        from memlab.probes.invert.space_reader import SpaceReader

        enc = load_space(spec, device=device)
        return enc, SpaceReader(enc.space, spec, vocab_size=len(enc.tokenizer))
    from memlab.probes.encoders.sources import load_transformers

    enc = load_transformers(spec, layer=layer, device=device, device_map=device_map)
    return enc, LayerReader(enc.model, layer, vocab_size=len(enc.tokenizer))


def affixes(enc) -> tuple[list[int], list[int]]:
    """The special tokens the encoder reads before and after a chunk (none for a space, which adds none)."""
    return list(getattr(enc, "prefix", []) or []), list(getattr(enc, "suffix", []) or [])


def states_source(model, enc, reader: LayerReader, device: str) -> tuple[str, LayerReader]:
    """The model whose states are inverted and its reader (``model``: the run's
    :class:`~memlab.probes.invert.options.ModelOptions`): ``--states-from`` (same tokenizer and width) or the
    model itself."""
    if not model.states_from:
        return model.model, reader
    src = model.states_from
    other, src_reader = load(src, model.layer, device)
    if len(other.tokenizer) != len(enc.tokenizer) or other.dim != enc.dim:
        raise ModelError(f"--states-from {src}: its tokenizer ({len(other.tokenizer)} tokens) or width "
                         f"({other.dim}) differs from {model.model}'s ({len(enc.tokenizer)}, {enc.dim})")
    return src, src_reader


def setup(opts):
    """Threads, device, the model and its reader, the chunks, the probe run's reading of them (``--probe``; else
    None): ``(device, enc, reader, texts, chunks, side)``."""
    from memlab.devices import resolve_device

    if opts.model.threads:
        torch.set_num_threads(opts.model.threads)
    device = str(resolve_device(opts.model.device))
    enc, reader = load(opts.model.model, opts.model.layer, device, opts.model.device_map)
    side = None
    if opts.model.probe:  # the probe run's held-out chunks, as it cut them, and its decoder's reading of them
        from memlab.probes.invert.beside.side import read_probe_side  # only with --probe: the trained probe's pipeline

        side = read_probe_side(opts.model.probe, opts.text.n, device)
        texts, chunks = side.texts, side.ids
    else:
        texts, chunks = chunk_ids(opts.text, enc.tokenizer)
    if not chunks:
        raise DataError("no chunk to invert")
    if len(chunks) < opts.text.n:  # never fewer chunks than asked for without a word
        t = opts.text
        where = f"the probe run {opts.model.probe}" if opts.model.probe else f"the {t.eval_split} split of '{t.corpus}'"
        raise DataError(f"--n {t.n} is more than the {len(chunks)} held-out chunks of {t.seq_len} {t.chunk_by} that "
                        f"{where} gives; give --n {len(chunks)} or fewer")
    return device, enc, reader, texts, chunks, side
