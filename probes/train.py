"""Probe data, the embedding cache, decoder training and evaluation.

Definitions (all on held-out chunks, nats, over the full vocabulary V of the
probed model's tokenizer):

* **CE**: mean cross-entropy per target token of the decoder rebuilding the
  chunk from its embedding (teacher forced).
* **Token accuracy**: share of target tokens where the decoder's argmax
  equals the true token.
* **Entropy ratio** ``H_r = 1 - CE / ln V``: 0 for a decoder no better than
  uniform, 1 for perfect reconstruction (the memory-models paper's measure).
* **Accuracy by position**: token accuracy at each position of the chunk.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from memlab.data.corpus import load_corpus, make_splits, require_split, units
from memlab.data.views import clean_text, token_chunks
from memlab.devices import probe_autocast
from memlab.errors import DataError, MemlabError
from memlab.probes.chunks import fill_pad, mask_of, pick_texts, word_chunks
from memlab.probes.decoder import ProbeDecoder, ProbeDecoderConfig
from memlab.progress import progress_bar


def start_token_id(tokenizer) -> int:
    """The id that starts every decoder input: BOS, else CLS, else EOS, else pad."""
    for name in ("bos_token_id", "cls_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v)
    return 0


def shift_right(ids: torch.Tensor, start_id: int) -> torch.Tensor:
    """(B, T) -> (B, T): the start id, then the tokens up to T-1 (teacher forcing)."""
    start = torch.full_like(ids[:, :1], start_id)  # (B, 1)
    return torch.cat([start, ids[:, :-1]], dim=1)  # (B, T)


@lru_cache(maxsize=2)
def _splits(corpus: str) -> dict:
    """The probe's units of a corpus (chapters, or paragraph blocks of a chapterless text), split 90/5/5 with
    seed 0: memlab's default data settings, read once per process."""
    return make_splits(units(load_corpus(corpus), "chapter"), 0.05, 0.05, 0)


@lru_cache(maxsize=2)
def _split_texts(corpus: str) -> dict[str, list[str]]:
    """Cleaned texts of each split of a corpus."""
    return {k: [clean_text(d.text) for d in v] for k, v in _splits(corpus).items()}


def split_description(corpus: str) -> str:
    """How the probe's corpus was cut into units and split (for the report: ``report["data_split"]``)."""
    from memlab.data.corpus import describe_splits

    return describe_splits(_splits(corpus))


def _texts_of(corpus: str, split: str) -> list[str]:
    splits = _split_texts(corpus)
    if split not in splits:
        raise DataError(f"unknown split '{split}'; use train, validation or test")
    if not splits[split]:  # names the empty split and how the corpus was cut
        require_split(_splits(corpus), split, corpus)
    return splits[split]


def probe_texts(words: int, n: int, split: str, corpus: str = "austen", seed: int = 0,
                at_most: bool = False) -> list[str]:
    """``n`` chunks of ``words`` words from one split of the corpus, as text: the same for every tokenizer
    (``at_most``: all there are when the split holds fewer than ``n``)."""
    chosen = pick_texts(_texts_of(corpus, split), 7 * words * n * 2, seed)  # about 6 characters a word, twice
    return word_chunks(chosen, words, n, seed, f"the {split} split of '{corpus}'", at_most=at_most)


def probe_chunks(tokenizer, seq_len: int, n: int, split: str, corpus: str = "austen", seed: int = 0,
                 at_most: bool = False) -> torch.Tensor:
    """``n`` chunks of ``seq_len`` tokens ``(n, T)`` from one split of the corpus, in ``tokenizer``
    (``at_most``: all there are when the split holds fewer than ``n``).

    Splits are memlab's (chapter units, 5 % validation and 5 % test, seed 0),
    so ``test`` is text no model trained by ``memlab train`` on the default
    data settings has seen. Units are read in a seeded order until there are
    enough tokens, and ``n`` chunks are drawn from them.
    """
    texts = _texts_of(corpus, split)
    chosen = pick_texts(texts, 8 * seq_len * n * 2, seed)  # about 4 characters a token, twice the need
    try:
        chunks = token_chunks(chosen, tokenizer, seq_len)  # (M, T)
    except DataError as e:  # not one chunk: nothing to score or train on
        raise DataError(f"the {split} split of '{corpus}' holds no chunk of {seq_len} tokens ({e})") from None
    if chunks.shape[0] < n and not at_most:
        raise DataError(f"the {split} split of '{corpus}' holds only {chunks.shape[0]} chunks of {seq_len} tokens; "
                        f"{n} asked")
    pick = torch.from_numpy(np.random.default_rng(seed + 1).permutation(chunks.shape[0])[:n])
    return chunks[pick]  # (n, T)


def _bar(total: int, desc: str, progress: bool | None):
    """A tqdm bar on a terminal (or ``progress=True``), plain lines in a log (:func:`memlab.progress.progress_bar`)."""
    return progress_bar(total, desc, progress)


def encode_all(encoder, ids: torch.Tensor, batch_size: int = 32, progress: bool | None = None,
               desc: str = "encode") -> torch.Tensor:
    """Run the frozen encoder once over full chunks ``(N, T)`` -> embeddings ``(N, D)`` float32."""
    out = []
    pad_id = getattr(encoder.tokenizer, "pad_token_id", None) or 0
    bar = _bar(ids.shape[0], desc, progress)
    # an encoder that masks its padding (a transformers model) reads chunks of like length together, each batch
    # cut to its longest chunk: no compute on padding; others (a space of fixed length) read the chunks as given
    cut = getattr(encoder, "masks_padding", False)
    order = torch.sort(mask_of(ids).sum(1), stable=True).indices if cut else torch.arange(ids.shape[0])  # (N,)
    with torch.no_grad():
        for i in range(0, ids.shape[0], batch_size):
            b = ids[order[i : i + batch_size]]  # (b, T), PAD after each chunk's tokens
            b = trim(b) if cut else b  # (b, T_b)
            out.append(encoder.encode(fill_pad(b, pad_id), mask_of(b).long()))  # (b, D)
            bar.update(b.shape[0])
    bar.close()
    z = torch.empty(ids.shape[0], out[0].shape[1], dtype=out[0].dtype) if out else torch.zeros(0, 0)  # (N, D)
    z[order] = torch.cat(out)  # back in the chunks' order
    if not torch.isfinite(z).all():
        raise MemlabError(f"{getattr(encoder, 'name', 'the encoder')} gave non-finite embeddings")
    return z


def content_hash(key: dict, *tensors: torch.Tensor) -> str:
    """sha256 of a JSON-able ``key`` and the bytes of ``tensors``: what a cached result depends on."""
    h = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
    for t in tensors:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def cached_encode(encoder, ids: torch.Tensor, key: dict, cache_dir: str | None, **kw) -> tuple[torch.Tensor, bool]:
    """:func:`encode_all`, memoised on disk under ``cache_dir`` by a hash of ``key`` and the ids (safetensors: one file,
    or shards and an index when large, :mod:`memlab.data.chunkcache`)."""
    if not cache_dir:
        return encode_all(encoder, ids, **kw), False
    from memlab.data.chunkcache import read_chunk_embeddings, write_chunk_embeddings

    path = Path(cache_dir) / f"emb-{content_hash(key, ids)[:20]}.safetensors"
    z = read_chunk_embeddings(path, ids)  # (N, D); None when absent, damaged or of other chunks (then rebuilt)
    if z is not None:
        return z, True
    z = encode_all(encoder, ids, **kw)
    write_chunk_embeddings(path, z, ids)
    return z, False


def build_decoder(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True) -> ProbeDecoder:
    """A fresh decoder for :class:`~memlab.probes.inversion.ProbeOptions` ``opts`` (its decoder fields and seed);
    ``tokenizer`` and ``train_ids``: the targets' (the decoder's own tokenizer for ``decoder=pretrained:NAME``)."""
    torch.manual_seed(opts.seed)
    v = len(tokenizer)
    kept = sorted(set(torch.unique(train_ids).tolist()) - {-1}) if compact else list(range(v))
    if kept and kept[-1] >= v:
        raise DataError(f"token id {kept[-1]} is outside the tokenizer's {v} tokens")
    cfg = ProbeDecoderConfig(embed_dim=embed_dim, vocab_size=v, kept_ids=kept, start_id=start_token_id(tokenizer),
                             hidden_size=opts.hidden_size, num_layers=opts.num_layers, num_heads=opts.num_heads,
                             max_len=int(train_ids.shape[1]), conditioning=opts.conditioning, prefix_len=opts.prefix_len,
                             inputs=opts.inputs, cond_dropout=opts.cond_dropout, bag_head=opts.bag_head,
                             input_dropout=opts.input_dropout, repeat_penalty=opts.repeat_penalty)
    from memlab.probes.parts import DecoderKind, get_part, split_name

    part = get_part("decoder", opts.decoder)
    if isinstance(part.impl, DecoderKind):  # its argument (decoder=pretrained:NAME) and its own options
        return part.impl.build(cfg, split_name(opts.decoder)[1], {o: getattr(opts, o) for o in part.options})
    return part.impl(cfg)


def autocast_context(device: torch.device):
    """bf16 autocast where the device multiplies bf16 natively, a CPU included; otherwise none
    (:func:`memlab.devices.probe_autocast`, which decides; ``MEMLAB_ACCEL`` forces a side)."""
    return probe_autocast(device)


def trim(ids: torch.Tensor) -> torch.Tensor:
    """(b, T) chunk ids -> (b, T_b): without the columns that are padding in every row (a host tensor: no sync)."""
    n = int(mask_of(ids).sum(1).max()) if ids.numel() else 0
    return ids[:, : max(n, 1)]


def start_token_id_from(dec: ProbeDecoder) -> int:
    return int(dec.config.start_id)


@torch.no_grad()
def evaluate(dec: ProbeDecoder, z: torch.Tensor, ids: torch.Tensor, batch_size: int = 128) -> dict:
    """CE (nats), token accuracy, entropy ratio ``1 - CE / ln V`` and accuracy by position on ``ids`` (N, T), over
    real tokens (PAD skipped); ``_per_chunk`` holds each chunk's summed NLL (nats), hits and tokens (for the
    intervals, :mod:`memlab.probes.intervals`). Sums stay on the device; the host reads them once."""
    dec.eval()
    device = next(dec.parameters()).device
    v, t_all = dec.config.vocab_size, ids.shape[1]
    nll_c, hit_c, hit_pos = [], [], []
    start = start_token_id_from(dec)
    for i in range(0, ids.shape[0], batch_size):
        zb, tb = z[i : i + batch_size].to(device), trim(ids[i : i + batch_size]).to(device)  # (b, D), (b, T_b)
        logits = dec(zb, shift_right(fill_pad(tb), start)).float()  # (b, T_b, C)
        real = mask_of(tb)  # (b, T_b)
        tc = dec.compact_targets(tb)  # (b, T_b), -100 at pads
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tc.reshape(-1), reduction="none").view(tc.shape)  # (b, T_b), 0 at pads
        if dec.has_other:
            nll = nll + (tc == dec.num_kept).float() * dec.other_penalty()
        hit = (dec.predict_full(logits) == tb) & real  # (b, T_b)
        nll_c.append(nll.sum(1))  # (b,)
        hit_c.append(hit.sum(1))  # (b,)
        hit_pos.append(torch.nn.functional.pad(hit.sum(0), (0, t_all - tb.shape[1])))  # (T,)
    nll_chunk, hits = torch.cat(nll_c).double().cpu(), torch.cat(hit_c).cpu()  # (N,), (N,)
    correct = torch.stack(hit_pos).sum(0).cpu()  # (T,)
    counts = mask_of(ids).sum(0)  # (T,) real tokens at each position (host ids)
    n_tok = int(counts.sum())
    ce = float(nll_chunk.sum()) / max(n_tok, 1)
    by_pos = (correct.float() / counts.clamp(min=1).float()).tolist()
    per_chunk = {"nll": nll_chunk.numpy(), "hits": hits.numpy(), "tokens": mask_of(ids).sum(1).numpy()}
    return {"ce": ce, "token_accuracy": float(correct.sum()) / max(n_tok, 1), "entropy_ratio": 1.0 - ce / math.log(v),
            "accuracy_by_position": by_pos, "n_tokens": n_tok, "_per_chunk": per_chunk}


def information_gain(ce_probe: float, ce_control: float) -> float:
    """``(CE_control - CE_probe) / CE_control``: the share of the control's loss the embedding removes."""
    return (ce_control - ce_probe) / ce_control if ce_control > 0 else 0.0


class Timer:
    """``with Timer() as t: ...``; then ``t.seconds``."""

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *a):
        self.seconds = time.perf_counter() - self.t0
