"""Alignment read-out (ALGEN-style): a ridge map from the probed embedding into a shipped inverter's space.

A space that already inverts its own vectors (by default the shipped memory
autoencoder, ``align_target: space:memory_ae``) reads a new encoder's
embedding once a linear map carries it into that space:

1. **Pairs.** The target space encodes the texts of the training chunks (the
   same text the probed encoder read, tokenized in the *target's* tokenizer):
   memories ``y`` (N, D') (``(N, K, D)`` memories flattened).
2. **Map.** Ridge regression ``y ~ x W + b`` on the standardised embedding
   ``x`` (training mean and std), in closed form through the thin SVD of ``x``.
   The intercept is not penalised; the ridge strength ``lambda = alpha * N`` is
   the one of :data:`ALPHAS` with the lowest exact **leave-one-out** squared
   error (from the SVD: residual ``/ (1 - h_ii)``, ``h_ii = 1/N + sum_j
   U_ij^2 s_j^2 / (s_j^2 + lambda)``), so every training chunk is used to fit it
   and none is held back.
3. **Read.** The mapped held-out embeddings are decoded by the target's own
   decoder over the target's tokens (the labels its ``decoder_inputs`` gives:
   for the memory autoencoder the chunk's tokens and its end token; for a
   fitted probe, ``space:probe:RUN``, the texts in the tokenizer its decoder
   rebuilds, which for ``decoder=pretrained`` is the LM's, not its encoder's):
   teacher-forced NLL and argmax hits per chunk, and the greedy reconstruction
   (``generate``) scored by token-set F1 (:mod:`memlab.probes.readings`).

Scores: ``recovered`` is the mean over held-out chunks of each chunk's token
accuracy (the measure the memory autoencoder's own decoder is quoted in);
``prior`` is the same for the map fitted on a constant embedding, which is the
mean training memory for every chunk (a ridge map of a constant predicts the
mean target), decoded by the same decoder; ``gain = recovered - prior``.
``_per_chunk`` also holds the NLL of both (``nll``, ``prior_nll``, nats over the
same target tokens) and their TF1 (``tf1``, ``prior_tf1``), so
:mod:`memlab.probes.readings` reports ``align_bits_per_chunk`` with a paired
bootstrap interval. ``own`` is the target's decoder reading the target's own
memories of the held-out chunks (the ceiling the map can reach) and ``own.r2`` the
share of their variance the map predicts (what limits a low reading).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from memlab.errors import ConfigError, DataError, ModelError
from memlab.paths import resource
from memlab.probes.chunks.cut import tokenize_chunks
from memlab.probes.chunks.batch import PAD, fill_pad, mask_of, trim
from memlab.probes.encoders.sources import load_encoder
from memlab.probes.options import train_sizes
from memlab.probes.readings import token_set_f1_per_chunk
from memlab.probes.encoders.encode import cached_encode
from memlab.probes.sections import AlignOptions
from memlab.probes.decoder.fit import Timer

DEFAULT_TARGET = AlignOptions.align_target
"""``space:memory_ae`` without a path: the shipped memory autoencoder (memlab/resources/checkpoints/memory_ae-small)."""
ALPHAS = tuple(10.0 ** k for k in range(-6, 5))
"""Ridge strengths tried, per training chunk (``lambda = alpha * N`` on the standardised embedding)."""
MIN_PAIRS = 10
"""Fewest training chunks the map is fitted on (its ridge strength is chosen by leave-one-out)."""
MAX_WEIGHTS = 1 << 26
"""Most weights (D x D') of the map: past it the closed form does not fit in memory."""


def target_spec(spec: str | None) -> str:
    """``align_target`` -> the ``space:NAME[:ARG]`` the target is loaded from (see :data:`DEFAULT_TARGET`)."""
    spec = (spec or DEFAULT_TARGET).strip()
    if not spec.startswith("space:"):
        raise ConfigError(f"align_target must be space:NAME[:PATH] (a registered embedding space whose decoder reads "
                          f"its vectors, e.g. {DEFAULT_TARGET}), got {spec!r}")
    if spec == DEFAULT_TARGET:

        return f"{DEFAULT_TARGET}:{resource('checkpoints') / 'memory_ae-small'}"
    return spec


@lru_cache(maxsize=1)
def load_target(spec: str):
    """The target space of ``align_target`` as a frozen encoder (:class:`memlab.probes.encoders.capture.SpaceEncoder`:
    ``.space`` decodes); one kept in memory."""

    enc = load_encoder(target_spec(spec))
    missing = [m for m in ("decoder_inputs", "decode_logits", "generate") if not hasattr(enc.space, m)]
    if missing:
        raise ModelError(f"align_target {spec}: the space has no decoder to read the mapped vectors "
                         f"(no {', '.join(missing)})")
    return enc


def target_ids(target, texts: list[str]) -> torch.Tensor:
    """Chunk texts -> (N, T') ids in the target's tokenizer (PAD after each chunk); one line when it cannot read
    them: an unknown token, no token, or more tokens than the target space reads."""

    tok, name = target.tokenizer, target.name
    ids, _ = tokenize_chunks(texts, tok)  # (N, T')
    unk = getattr(tok, "unk_token_id", None)
    if unk is not None and (bad := int((ids == unk).any(1).sum())):
        raise DataError(f"align_target {name}: its tokenizer cannot encode the corpus text ({bad} of {len(texts)} "
                        f"chunks hold its unknown token {tok.unk_token!r})")
    if target.max_length is not None and ids.shape[1] > target.max_length:
        longest = int((ids >= 0).sum(1).max())
        raise DataError(f"align_target {name}: a chunk takes {longest} of its tokens, more than the space reads "
                        f"({target.max_length}); lower seq_len or set max_chunk_tokens={target.max_length} with "
                        f"chunk_tokenizer naming its tokenizer")
    return ids


def decoder_tokenizer(space):
    """The tokenizer a target space's decoder rebuilds text in: a fitted probe's ``target_tokenizer`` (a pretrained
    decoder's, or a scratch decoder's named one), else the space's own."""
    return getattr(space, "target_tokenizer", None) or space.tokenizer


def label_ids(target, texts: list[str], ids: torch.Tensor) -> torch.Tensor:
    """Chunk texts -> (N, T'') ids the target's decoder is scored over: ``ids`` (its encoder's) when its decoder
    reads the same tokenizer, else the texts in the decoder's (one line when it cannot encode them or rebuilds
    fewer positions)."""

    tok = decoder_tokenizer(target.space)
    out = ids if tok is target.tokenizer else tokenize_chunks(texts, tok)[0]  # (N, T'')
    unk = getattr(tok, "unk_token_id", None)
    if out is not ids and unk is not None and (bad := int((out == unk).any(1).sum())):
        raise DataError(f"align_target {target.name}: its decoder's tokenizer cannot encode the corpus text ({bad} "
                        f"of {len(texts)} chunks hold its unknown token {tok.unk_token!r})")
    room = getattr(target.space, "max_length", None)  # the most positions its decoder rebuilds
    if room is not None and out.shape[1] > room:
        raise DataError(f"align_target {target.name}: a chunk takes {int((out >= 0).sum(1).max())} tokens of its "
                        f"decoder's tokenizer, more than it rebuilds ({room}); lower seq_len")
    return out


def check_target(context) -> None:
    """Before any fitting: the target loads, reads every chunk text, and the map fits (``Part.check_context``)."""

    target = load_target(context.option("align_target", DEFAULT_TARGET))
    n = min(train_sizes(context.opts)) if context.opts is not None else len(context.texts_train)
    check_fits(n, context.dim, target.dim, target.name)
    texts = list(context.texts_train) + list(context.texts_eval)
    label_ids(target, texts, target_ids(target, texts))


def check_fits(n: int, d_in: int | None, d_out: int, name: str) -> None:
    """One line when the map cannot be fitted: too few pairs, or too many weights for the closed form."""
    if n < MIN_PAIRS:
        raise ConfigError(f"the align read-out fits its map on the training chunks: {n} is fewer than {MIN_PAIRS}; "
                          "raise n_train")
    if d_in is not None and d_in * d_out > MAX_WEIGHTS:
        raise ConfigError(f"align_target {name}: a map from width {d_in} to the target's width {d_out} has "
                          f"{d_in * d_out:,} weights, more than the closed form holds ({MAX_WEIGHTS:,})")


@dataclass
class RidgeMap:
    """``predict(z) = ((z - mean) / std) @ weight + bias``, fitted by :func:`fit_ridge`."""

    mean: torch.Tensor  # (D,)
    std: torch.Tensor  # (D,)
    weight: torch.Tensor  # (D, D')
    bias: torch.Tensor  # (D',)
    alpha: float
    loo_mse: dict

    def predict(self, z: torch.Tensor) -> torch.Tensor:
        return (standardise(z, self.mean, self.std) @ self.weight + self.bias).float()  # (M, D')


def standardise(z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(z - mean) / std`` in float64, exactly 0 in a column that is constant in training (``std`` 0)."""
    scale = torch.where(std > 0, 1.0 / std.clamp(min=1e-300), torch.zeros_like(std))  # (D,)
    return (z.double() - mean) * scale  # (N, D)


def fit_ridge(z: torch.Tensor, y: torch.Tensor, alphas=ALPHAS) -> RidgeMap:
    """Standardise ``z`` (N, D), centre ``y`` (N, D') and pick the ridge strength by exact leave-one-out."""
    z, y = z.double(), y.double()
    n = z.shape[0]
    mean = z.mean(0)  # (D,)
    spread = (z - mean).abs().amax(0)  # (D,)
    std = torch.where(spread > 1e-9 * (mean.abs() + 1.0), z.std(0), torch.zeros_like(mean))  # (D,) 0: constant
    x = standardise(z, mean, std)  # (N, D): a constant column is exactly 0
    y_mean = y.mean(0)  # (D',)
    yc = y - y_mean  # (N, D')
    u, s, vt = torch.linalg.svd(x, full_matrices=False)  # (N, r), (r,), (r, D)
    uty = u.T @ yc  # (r, D')
    s2, u2 = s * s, u * u  # (r,), (N, r)
    loo = {}
    for a in alphas:
        shrink = s2 / (s2 + a * n)  # (r,)
        resid = yc - u @ (shrink[:, None] * uty)  # (N, D')
        h = 1.0 / n + u2 @ shrink  # (N,) leverage, the unpenalised intercept's 1/N included
        loo[a] = float(((resid / (1.0 - h).clamp(min=1e-9)[:, None]) ** 2).mean())
    best = min(loo, key=loo.get)
    weight = vt.T @ ((s / (s2 + best * n))[:, None] * uty)  # (D, D')
    return RidgeMap(mean, std, weight, y_mean, best, loo)


@torch.no_grad()
def decode_stats(space, y: torch.Tensor, ids: torch.Tensor, shape: tuple, batch_size: int = 64) -> dict:
    """The target decoder reading vectors ``y`` (M, D') of chunks ``ids`` (M, T', in the tokenizer its decoder
    rebuilds: :func:`label_ids`) teacher-forced: per chunk the NLL (nats) and argmax hits over its labels, and how
    many labels."""

    pad = getattr(decoder_tokenizer(space), "pad_token_id", None) or 0
    nll, hits, tokens = [], [], []
    for i in range(0, ids.shape[0], batch_size):
        tb = trim(ids[i : i + batch_size])  # (b, T_b)
        dec_in, labels = space.decoder_inputs(fill_pad(tb, pad), mask_of(tb).long())  # (b, T''), (b, T'')
        zb = y[i : i + batch_size].reshape(tb.shape[0], *shape)  # (b, D') or (b, K, D)
        logits = space.decode_logits(zb, dec_in).float().cpu()  # (b, T'', V)
        keep = labels != -100  # (b, T'')
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               ignore_index=-100, reduction="none").view(labels.shape)  # (b, T'')
        nll.append(ce.sum(1).double())
        hits.append(((logits.argmax(-1) == labels) & keep).sum(1))
        tokens.append(keep.sum(1))
    return {"nll": torch.cat(nll).numpy(), "hits": torch.cat(hits).numpy(), "tokens": torch.cat(tokens).numpy()}


@torch.no_grad()
def greedy_tf1(space, y: torch.Tensor, ids: torch.Tensor, shape: tuple, batch_size: int = 64) -> list[float]:
    """Token-set F1 of the target decoder's greedy reconstruction from ``y`` (M, D') against ``ids`` (M, T')."""

    texts = []
    for i in range(0, y.shape[0], batch_size):
        zb = y[i : i + batch_size]
        texts += space.generate(zb.reshape(zb.shape[0], *shape), max_new_tokens=ids.shape[1] + 1)
    rows = decoder_tokenizer(space)(texts, add_special_tokens=False)["input_ids"]
    pred = torch.full((len(rows), max(1, max(len(r) for r in rows))), PAD, dtype=torch.long)  # (M, T_p)
    for j, r in enumerate(rows):
        pred[j, : len(r)] = torch.tensor(r, dtype=torch.long)
    return token_set_f1_per_chunk(pred, ids)


def _accuracy(stats: dict) -> list[float]:
    return [h / max(t, 1) for h, t in zip(stats["hits"].tolist(), stats["tokens"].tolist())]


def _mean(x: list[float]) -> float:
    return sum(x) / max(len(x), 1)


def fit_align(z_train: torch.Tensor, z_eval: torch.Tensor, context, own: bool = True) -> dict:
    """Fit the map on the training pairs, decode the held-out chunks through it (see the module doc)."""

    if context is None or context.texts_train is None or context.texts_eval is None:
        raise ModelError("the align read-out needs the chunk texts (a ReadoutContext, memlab.probes.parts)")
    spec = context.option("align_target", DEFAULT_TARGET)
    target = load_target(spec)
    n, m = z_train.shape[0], z_eval.shape[0]
    texts_tr, texts_ev = list(context.texts_train)[:n], list(context.texts_eval)[:m]
    check_fits(n, z_train.shape[1], target.dim, target.name)
    ids_tr, ids_ev = target_ids(target, texts_tr), target_ids(target, texts_ev)  # (N, T'), (M, T')
    lab_ev = label_ids(target, texts_ev, ids_ev)  # (M, T''): what its decoder rebuilds
    key = {"align_target": target_spec(spec)}
    cache = context.option("cache_dir", None)
    with Timer() as t_enc:
        y_tr, _ = cached_encode(target, ids_tr, key, cache, desc="align: target memories")  # (N, D')
        y_own, _ = cached_encode(target, ids_ev, key, cache, desc="align: target memories") if own else (None, 0)
    with Timer() as t_fit:
        ridge = fit_ridge(z_train, y_tr)
        y_hat = ridge.predict(z_eval)  # (M, D')
    space, shape = target.space, tuple(target.space.encode_text(["a"]).shape[1:])
    prior_y = ridge.bias.float().expand(m, -1).contiguous()  # (M, D'): the map of a constant embedding
    with Timer() as t_dec:
        got, base = decode_stats(space, y_hat, lab_ev, shape), decode_stats(space, prior_y, lab_ev, shape)
        tf1, prior_tf1 = greedy_tf1(space, y_hat, lab_ev, shape), greedy_tf1(space, prior_y, lab_ev, shape)
        mine = decode_stats(space, y_own, lab_ev, shape) if own else None
    acc, prior_acc = _accuracy(got), _accuracy(base)
    ln2 = math.log(2)
    out = {"recovered": _mean(acc), "prior": _mean(prior_acc), "gain": _mean(acc) - _mean(prior_acc),
           "token_set_f1": _mean(tf1), "prior_token_set_f1": _mean(prior_tf1),
           "ce": float(got["nll"].sum() / got["tokens"].sum()),
           "prior_ce": float(base["nll"].sum() / base["tokens"].sum()),
           "bits_per_chunk": float((base["nll"] - got["nll"]).mean() / ln2),
           "target": target.name, "n_tokens": int(got["tokens"].sum()), "target_dim": int(target.dim), "alpha": ridge.alpha, "n_pairs": n,
           "seconds_by_step": {"target_encode": t_enc.seconds, "fit": t_fit.seconds, "decode": t_dec.seconds},
           "definition": "mean over held-out chunks of the target decoder's token accuracy reading the ridge map of "
                         "the embedding into the target space (prior: the map of a constant embedding, the mean "
                         "training memory); bits per chunk: prior NLL - NLL over the target's tokens, in bits",
           "_per_chunk": {"recovered": acc, "prior": prior_acc, "nll": got["nll"], "prior_nll": base["nll"],
                          "tf1": tf1, "prior_tf1": prior_tf1}}
    if mine is not None:
        resid, spread = ((y_own - y_hat) ** 2).sum(), ((y_own - ridge.bias.float()) ** 2).sum()
        out["own"] = {"recovered": _mean(_accuracy(mine)), "ce": float(mine["nll"].sum() / mine["tokens"].sum()),
                      "r2": float(1.0 - resid / spread.clamp(min=1e-12)),
                      "definition": "the target decoder reading the target's own memories of the same chunks; r2: "
                                    "the share of their variance (around the training mean) that the map predicts"}
    return out


# the align read-out part's code (registered in memlab.probes.catalog)

def align_readout(z_train, train_ids, z_eval, eval_ids, seed: int = 0, device: str = "cpu", context=None) -> dict:
    return fit_align(z_train, z_eval, context)


def align_summary(a: dict) -> str:
    own = (f"; the target's decoder on its own memories {a['own']['recovered']:.3f}, the map predicts "
           f"{a['own']['r2']:.2f} of their variance" if a.get("own") else "")
    return (f"alignment read-out into {a['target']}: token accuracy {a['recovered']:.3f} (prior "
            f"{a['prior']:.3f}{own}), TF1 {a['token_set_f1']:.3f} (prior {a['prior_token_set_f1']:.3f}), {a['bits_per_chunk']:.1f} bits per "
            f"chunk; ridge alpha {a['alpha']:g} by leave-one-out")


def align_columns(a: dict) -> dict:
    return {"align_recovered": a["recovered"], "align_prior": a["prior"], "align_token_set_f1": a["token_set_f1"],
            "align_bits_per_chunk": a["bits_per_chunk"]}
