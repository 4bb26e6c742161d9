"""Encode once: the frozen encoder's pass over the chunks, memoised on disk.

:func:`encode_data` is the probe run's third step (after the encoder is loaded and the text is cut): the training
and held-out chunks are embedded once, in batches, and every decoder, read-out and sweep reads the same cached
embeddings. With ``cache_dir`` the embeddings are kept as safetensors (:mod:`memlab.data.chunkcache`) under a hash
of what they depend on (:func:`encoder_spec`, the encoder's description and the chunk ids).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from memlab.data.chunkcache import read_chunk_embeddings, write_chunk_embeddings
from memlab.errors import MemlabError
from memlab.probes.chunks import fill_pad, mask_of, trim
from memlab.probes.options import ProbeOptions
from memlab.progress import progress_bar


def encoder_spec(opts: ProbeOptions, encoder=None) -> dict:
    spec = {"model": opts.model, "layer": opts.layer, "pool": opts.pool, "final_norm": opts.final_norm,
            "random_init": opts.random_init, "special_tokens": opts.special_tokens, "dtype": opts.encoder_dtype}
    if opts.part_options:  # a plugin encoder kind's or pooling's options may change the embeddings
        spec["part_options"] = dict(opts.part_options)
    if getattr(encoder, "resizable", False):  # a synthetic code's width depends on its length
        spec["max_len"] = int(getattr(encoder, "max_length", None) or opts.seq_len)
    return spec


def encode_all(encoder, ids: torch.Tensor, batch_size: int = 32, progress: bool | None = None,
               desc: str = "encode") -> torch.Tensor:
    """Run the frozen encoder once over full chunks ``(N, T)`` -> embeddings ``(N, D)`` float32."""
    out = []
    pad_id = getattr(encoder.tokenizer, "pad_token_id", None) or 0
    bar = progress_bar(ids.shape[0], desc, progress)
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
    path = Path(cache_dir) / f"emb-{content_hash(key, ids)[:20]}.safetensors"
    z = read_chunk_embeddings(path, ids)  # (N, D); None when absent, damaged or of other chunks (then rebuilt)
    if z is not None:
        return z, True
    z = encode_all(encoder, ids, **kw)
    write_chunk_embeddings(path, z, ids)
    return z, False


def encode_data(opts: ProbeOptions, encoder, train_ids, eval_ids):
    """Embeddings (N, D), (M, D) of the chunks (disk-cached under ``opts.cache_dir``) and whether both were cached."""
    key = {**encoder_spec(opts, encoder), "enc": encoder.describe()}
    kw = dict(batch_size=opts.encode_batch_size, progress=opts.progress)
    z_train, hit1 = cached_encode(encoder, train_ids, key, opts.cache_dir, desc="encode train", **kw)  # (N, D)
    z_eval, hit2 = cached_encode(encoder, eval_ids, key, opts.cache_dir, desc="encode held-out", **kw)  # (M, D)
    return z_train, z_eval, bool(hit1 and hit2)
