"""Encode once: the cached embeddings of the probe's chunks, in batches, on disk keyed by the encoder's options alone
(the cache's files: :mod:`memlab.data.mmapcache`), shared out over a launch's processes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path
import torch

from memlab.data.chunkcache import read_chunk_embeddings
from memlab.data.mmapcache import cached_embeddings
from memlab.errors import MemlabError
from memlab.probes.chunks.batch import fill_pad, mask_of, trim
from memlab.probes.encoders import shards
from memlab.probes.options import ProbeOptions
from memlab.probes.parts import encoder_kind, get_part
from memlab.probes.sections import AlignOptions, BowOptions, EncoderSection, ReadoutSection, RunSection
from memlab.progress import progress_bar


ENCODER_SIDE = ({f.name for s in (EncoderSection, ReadoutSection, RunSection) for f in fields(s)}
                | {f.name for c in (AlignOptions, BowOptions) for f in fields(c)} | {"race"})
"""Options a control run does not depend on: the encoder's, the read-outs' and the run's, and the racing of the
probe's candidates (which starts after the control is trained)."""


def encoder_spec(opts: ProbeOptions, encoder=None) -> dict:
    spec = {"model": opts.model, "layer": opts.layer, "pool": opts.pool, "final_norm": opts.final_norm,
            "random_init": opts.random_init, "special_tokens": opts.special_tokens, "dtype": opts.encoder_dtype}
    own = encoder_options(opts)
    if own:  # a plugin encoder kind's or pooling's own options change the embeddings; no other part's do
        spec["part_options"] = own
    if getattr(encoder, "resizable", False):  # a synthetic code's width depends on its length
        spec["max_len"] = int(getattr(encoder, "max_length", None) or opts.seq_len)
    return spec


def encoder_options(opts: ProbeOptions) -> dict:
    """The plugin options (``part_options``) of the chosen encoder kind and pooling: the only part options the
    embeddings depend on (a decoder's or a read-out's are not in the embedding cache's key)."""
    kind = encoder_kind(opts.model)
    parts = [kind] if kind is not None else []
    if opts.pool is not None:
        parts.append(get_part("pool", opts.pool))
    names = {o for p in parts for o in p.option_names}
    return {k: v for k, v in (opts.part_options or {}).items() if k in names}


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


def cached_encode(encoder, ids: torch.Tensor, key: dict, cache_dir: str | None, dtype: str = "float32", env=None,
                  **kw) -> tuple[torch.Tensor, bool]:
    """:func:`encode_all`, memoised on disk under ``cache_dir`` by a hash of ``key`` and the ids: written a piece at a
    time to a memory-mapped file in storage ``dtype``, resumed after a kill, read mapped
    (:mod:`memlab.data.mmapcache`); a float32 cache of the earlier safetensors form is still read
    (:mod:`memlab.data.chunkcache`). ``env``: the processes of a launch, each encoding its share
    (:func:`memlab.probes.encoders.shards.cached_sharded`)."""
    if env is not None:
        stem = Path(cache_dir) / f"emb-{content_hash(key, ids)[:20]}" if cache_dir else None
        return shards.cached_sharded(env, stem, ids, lambda b: encode_all(encoder, b, **kw), dtype)
    if not cache_dir:
        return encode_all(encoder, ids, **kw), False
    stem = Path(cache_dir) / f"emb-{content_hash(key, ids)[:20]}"
    if dtype == "float32" and (z := read_chunk_embeddings(stem.with_suffix(".safetensors"), ids)) is not None:
        return z, True  # (N, D)
    return cached_embeddings(stem, ids, lambda b: encode_all(encoder, b, **kw), dtype,
                             width=getattr(encoder, "dim", None))  # (N, D)


def encode_data(opts: ProbeOptions, encoder, train_ids, eval_ids, env=None):
    """Embeddings (N, D), (M, D) of the chunks (disk-cached under ``opts.cache_dir``) and whether both were cached;
    ``env``: the processes of a launch, sharing the encoder pass out."""
    key = {**encoder_spec(opts, encoder), "enc": encoder.describe()}
    main = env is None or env.is_main
    kw = dict(batch_size=opts.encode_batch_size, progress=opts.progress if main else False, dtype=opts.cache_dtype,
              env=env)
    z_train, hit1 = cached_encode(encoder, train_ids, key, opts.cache_dir, desc="encode train", **kw)  # (N, D)
    z_eval, hit2 = cached_encode(encoder, eval_ids, key, opts.cache_dir, desc="encode held-out", **kw)  # (M, D)
    return z_train, z_eval, bool(hit1 and hit2)
