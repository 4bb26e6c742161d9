"""Fit the probe's decoders: build them, train them as one group, score them on the held-out chunks.

:func:`fit_decoders` is the probe run's decoder step: the probe decoder, with ``select_decoder`` the plain decoder
beside it, and the control (the same decoder on a constant embedding) are built from the same seed and trained
together by :func:`memlab.probes.group.train_decoders` (one loop: the same batches, optimiser, schedule and early
stopping for each; read-outs trained by gradient, such as the bag-of-words head, join the probe's group as members of
their own); the kept one is scored by :func:`evaluate` and the reconstruction scorers
(:mod:`memlab.probes.readings`).

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

import copy
import math
import time
from dataclasses import replace

import torch

from memlab.errors import DataError
from memlab.probes.chunks import fill_pad, mask_of, shift_right, trim
from memlab.probes.decoder import ProbeDecoder, ProbeDecoderConfig
from memlab.probes.group import train_decoders
from memlab.probes.parts import DecoderKind, get_part, own_options, part_options, split_name
from memlab.probes.readings import reconstruction_scores
from memlab.probes.result import ChunkScores, DecoderScores


def start_token_id(tokenizer) -> int:
    """The id that starts every decoder input: BOS, else CLS, else EOS, else pad."""
    for name in ("bos_token_id", "cls_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            return int(v)
    return 0


def _plugin_options(opts) -> dict:
    """The options of plugin conditionings, input modes and decoders that ``opts`` chooses: kept in the decoder's
    config (saved with it), where their parts read them."""
    chosen = {o for k in ("conditioning", "inputs", "decoder") for o in get_part(k, getattr(opts, k)).options}
    return {k: v for k, v in (opts.part_options or {}).items() if k in chosen}


def build_decoder(embed_dim: int, tokenizer, train_ids: torch.Tensor, opts, compact: bool = True) -> ProbeDecoder:
    """A fresh decoder for :class:`~memlab.probes.options.ProbeOptions` ``opts`` (its decoder fields and seed);
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
                             input_dropout=opts.input_dropout, repeat_penalty=opts.repeat_penalty,
                             **_plugin_options(opts))
    part = get_part("decoder", opts.decoder)
    if isinstance(part.impl, DecoderKind):  # its argument (decoder=pretrained:NAME) and its own options
        return part.impl.build(cfg, split_name(opts.decoder)[1], part_options(opts, part))
    return part.impl(cfg, **own_options(part, opts))


@torch.no_grad()
def evaluate(dec: ProbeDecoder, z: torch.Tensor, ids: torch.Tensor, batch_size: int = 128) -> DecoderScores:
    """CE (nats), token accuracy, entropy ratio ``1 - CE / ln V`` and accuracy by position on ``ids`` (N, T), over
    real tokens (PAD skipped), with each chunk's summed NLL (nats), hits and tokens (``chunks``, for the intervals,
    :mod:`memlab.probes.readings`). Sums stay on the device; the host reads them once."""
    dec.eval()
    device = next(dec.parameters()).device
    v, t_all = dec.config.vocab_size, ids.shape[1]
    nll_c, hit_c, hit_pos = [], [], []
    start = int(dec.config.start_id)
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
    per_chunk = ChunkScores(nll_chunk.numpy(), hits.numpy(), mask_of(ids).sum(1).numpy())
    metrics = {"ce": ce, "token_accuracy": float(correct.sum()) / max(n_tok, 1),
               "entropy_ratio": 1.0 - ce / math.log(v), "accuracy_by_position": by_pos, "n_tokens": n_tok}
    return DecoderScores(metrics, per_chunk)


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


def _held_back_ce(history: list[dict]) -> float:
    best = [h["best_val_ce"] for h in history if "best_val_ce" in h]
    return best[-1] if best else float("inf")


def _new_decoder(opts, tok, train_ids, z_train):
    dec = build_decoder(z_train.shape[1], tok, train_ids, opts, compact=opts.compact_vocab)
    dec.set_normalization(z_train)
    return dec


def _scored(dec, opts, tok, z_eval, eval_ids) -> DecoderScores:
    """The held-out scores of ``dec``: teacher-forced (:func:`evaluate`) and of its reconstructions."""
    return evaluate(dec, z_eval, eval_ids).with_reconstruction(
        reconstruction_scores(dec, z_eval, eval_ids, tok, opts.scorers, opts))


def fit_decoders(opts, tok, train_ids, eval_ids, z_train, z_eval, control: bool = False, cache: dict | None = None,
                 key: str | None = None, owner: str | None = None, desc: str = "probe decoder",
                 batched: bool | None = None, readouts: tuple = ()) -> dict:
    """The sequence decoders of one set of embeddings, trained as one group (:mod:`memlab.probes.group`: one batched
    pass, the same batches, each its own optimiser state and early stopping):

    * the probe decoder on (z_train, train_ids);
    * with ``select_decoder`` (and a bag head, and a held-back share) the plain decoder (no bag head, input dropout
      ``plain_input_dropout``): the one with the lower held-back CE is kept. The bag head reads content a
      positional read-out cannot learn from few chunks; it slows the positional read-out of an embedding that
      keeps every position (measurements: docs/results/probes.md). Choosing on held-back chunks keeps the held-out reading honest; only the kept one is scored;
    * with ``control`` the control: the same decoder on the mean training embedding for every chunk. It depends on
      the token data and decoder options only (the decoder's standardisation turns the mean into exact zeros), so
      probes of the same chunks share one through ``cache`` (keyed by ``key``); when cached it is not trained.
      With a control and held-back chunks the fit has two phases (:func:`_fit_contained`): the control first, then
      the probe started as the trained control (:func:`contain`), its start counted as epoch 0, beside the probe
      trained from a random start; ``scores["start"]`` says which was kept (``control``: epoch 0, ``contained``,
      ``scratch``). Without held-back chunks all are trained together from their random starts.

    ``readouts``: read-out members (:func:`memlab.probes.fitloop.train_members`) trained in the probe's group, beside
    the probe decoders; one left untrained (``history`` empty: no probe was trained, the probe is the control of a
    constant embedding) is the caller's to train.

    Returns ``{"probe": (decoder, held-out scores, history, seconds), "control": (scores, history, seconds, name
    of the probe that trained it or None) or None}``, each scores a :class:`~memlab.probes.result.DecoderScores`;
    ``scores.metrics["decoder_choice"]`` says which decoder was kept and why. Seconds: the group's, split over its members by the steps each ran.
    """
    selects = opts.select_decoder and opts.bag_head and opts.val_fraction > 0  # a plain decoder to choose from
    if control and cache is not None and key in cache and _is_constant(z_train, z_eval):
        # a constant embedding standardises to the control's exact zeros: nothing to read, the probe is the control
        metrics, hist_c, owner_, dec_c = cache[key][:4]
        return {"probe": _as_control(dec_c, opts, tok, train_ids, z_train, metrics, hist_c, "the cached control's"),
                "control": (metrics, hist_c, 0.0, owner_)}
    if control and opts.val_fraction > 0:  # without held-back chunks: the three trained together from scratch
        return _fit_contained(opts, tok, train_ids, eval_ids, z_train, z_eval, selects, cache, key, owner, desc,
                              batched, readouts)
    members = {"probe": (opts, z_train, z_eval)}
    if selects:
        members["plain"] = (replace(opts, bag_head=False, input_dropout=opts.plain_input_dropout), z_train, z_eval)
    cached = control and cache is not None and key in cache
    if control and not cached:
        const = z_train.mean(0, keepdim=True)  # (1, D)
        members["control"] = (opts, const.expand_as(z_train), const.expand_as(z_eval))
    decs = {k: _new_decoder(o, tok, train_ids, zt) for k, (o, zt, _) in members.items()}
    what = " and ".join(members) + (" decoders" if len(members) > 1 else " decoder")
    hists, secs = train_decoders(list(decs.values()), [zt for _, zt, _ in members.values()], train_ids, opts,
                                 progress=opts.progress, desc=desc if len(members) == 1 else what, batched=batched,
                                 readouts=readouts)
    hist, secs = dict(zip(members, hists)), dict(zip(members, secs))
    kept = "probe"
    if "plain" in members:
        ce, ce2 = _held_back_ce(hist["probe"]), _held_back_ce(hist["plain"])
        kept = "plain" if ce2 < ce else "probe"
        choice = _choice(opts, ce, ce2)
    m = _scored(decs[kept], members[kept][0], tok, z_eval, eval_ids)
    if "plain" in members:
        m = m.noted(decoder_choice=choice)
    out = {"probe": (decs[kept], m, hist[kept], secs["probe"] + secs.get("plain", 0.0)), "control": None}
    if cached:
        metrics, hist_c, owner_ = cache[key][:3]
        out["control"] = (metrics, hist_c, 0.0, owner_)
    elif control:
        mc = _scored(decs["control"], opts, tok, members["control"][2], eval_ids)
        if cache is not None:
            cache[key] = (mc, hist["control"], owner, decs["control"], decs["control"], mc, hist["control"])
        out["control"] = (mc, hist["control"], secs["control"], None)
    return out


def _choice(opts, ce_bag: float, ce_plain: float) -> dict:
    return {"bag_head": ce_bag, "plain": ce_plain, "kept": "plain" if ce_plain < ce_bag else "bag_head",
            "definition": "held-back CE (nats) of the decoder with the bag head and of the plain decoder (no "
                          f"bag head, input dropout {opts.plain_input_dropout}); the lower is kept"}


def contain(probe, control):
    """Start ``probe`` as the trained ``control``: every parameter and buffer of the control's (LoRA weights and a
    fine-tuned LM included) except the embedding's pathway (``probe.embedding_weights()``), which is zeroed, and
    the standardisation (``z_mean``, ``z_std``), which stays the probe's own. The control's output does not depend on
    the pathway (it reads exact zeros), so the probe then computes what the control computes, whatever the
    embedding; a control trained beside a probe of another embedding width serves as well. Returns ``probe``."""
    path = list(probe.embedding_weights())
    skip = set(path) | {"z_mean", "z_std"}
    drop = skip | set(control.embedding_weights())  # the control's pathway: never read (a plain probe lacks a bag head)
    state = {k: v for k, v in control.state_dict().items() if k not in drop}
    missing, unexpected = probe.load_state_dict(state, strict=False)
    if unexpected or set(missing) - skip:
        raise DataError(f"the control's weights do not fit the probe decoder (missing {sorted(set(missing) - skip)}, "
                        f"unexpected {sorted(unexpected)})")
    params = dict(probe.named_parameters())
    with torch.no_grad():
        for n in path:
            params[n].zero_()
    return probe


def contained_shares(dec, opts) -> dict[str, float] | None:
    """The learning-rate shares of a decoder started as its control (:func:`contain`): every trained weight it takes
    from the control at ``opts.contained_lr``, the embedding's pathway at the full rate (None: all at the full
    rate)."""
    if opts.contained_lr == 1.0:
        return None
    path = set(dec.embedding_weights())
    return {n: float(opts.contained_lr) for n, p in dec.named_parameters() if p.requires_grad and n not in path}


def _fit_contained(opts, tok, train_ids, eval_ids, z_train, z_eval, selects, cache, key, owner, desc, batched,
                   readouts=()):
    """:func:`fit_decoders` with a control and held-back chunks, in two phases.

    1. The control: trained from its random start (the *start* decoder), then trained again from there as the probe
       will be (epoch 0 counted, its weights at ``contained_lr``: :func:`contained_shares`), so that the probe gets
       no training the control did not get; the second run is the control the probe is read against. Cached under
       ``key``: (metrics, history, owner, control, start, the first run's metrics, the first run's history); the
       first run's metrics are None until a kept scratch probe reads them (its greedy reconstruction costs seconds).
    2. The probe (and the plain decoder with ``selects``) started as the start decoder with a silent embedding
       pathway (:func:`contain`), its pathway at the full learning rate and the rest at ``contained_lr``, trained
       with epoch 0 beside the probe trained from its own random start (the *scratch* candidate, all at the full
       rate), in one loop, with the read-out members ``readouts``.

    Each candidate is read against the control trained as much as it was: the contained probe against the second
    run, the scratch probe against the first. Kept: the candidate whose held-back CE lies furthest below its own
    control's (a tie keeps the contained probe); when neither lies below, the control itself (its function at the
    probe's width: exactly 0 bits). The kept probe's held-back CE is never above the control it is read against. On
    a constant embedding the contained probe's run is the control's second run, weight for weight."""
    const = z_train.mean(0, keepdim=True).expand_as(z_train)  # (N, D)
    if cache is not None and key in cache:
        mc, hist_c, owner_, dec_c, start, mc_1, hist_1 = cache[key]
        control_out, first_out = (mc, hist_c, 0.0, owner_), (mc_1, hist_1, 0.0, owner_)
    else:
        start = _new_decoder(opts, tok, train_ids, const)
        (hist_1,), (secs_1,) = train_decoders([start], [const], train_ids, opts, progress=opts.progress,
                                              desc="control decoder", batched=batched)
        dec_c = contain(_new_decoder(opts, tok, train_ids, const), start)
        (hist_2,), (secs_2,) = train_decoders([dec_c], [const], train_ids, opts, progress=opts.progress,
                                              desc="control decoder (second run)", batched=batched, epoch0=True,
                                              lr_scales=[contained_shares(dec_c, opts)])
        hist_c = hist_1 + [{**h, "run": 2} for h in hist_2]
        const_eval = z_train.mean(0, keepdim=True).expand_as(z_eval)
        mc, mc_1 = _scored(dec_c, opts, tok, const_eval, eval_ids), None  # the first run's: scored when read
        if cache is not None:
            cache[key] = (mc, hist_c, owner, dec_c, start, mc_1, hist_1)
        control_out, first_out = (mc, hist_c, secs_1 + secs_2, None), (mc_1, hist_1, secs_1, None)
    if _is_constant(z_train, z_eval):
        return {"probe": _as_control(dec_c, opts, tok, train_ids, z_train, mc, hist_c, "the control's"),
                "control": control_out}
    ce_c, ce_1 = _held_back_ce(hist_c), _held_back_ce(first_out[1])  # what each candidate is read against
    members = {"probe": opts}
    if selects:
        members["plain"] = replace(opts, bag_head=False, input_dropout=opts.plain_input_dropout)
    decs = {k: _new_decoder(o, tok, train_ids, z_train) for k, o in members.items()}
    if not all(callable(getattr(d, "embedding_weights", None)) for d in decs.values()):
        members, decs = {}, {}  # a decoder kind without an embedding pathway to silence: the scratch probe alone
    for d in decs.values():
        contain(d, start)
    shares = contained_shares(decs["probe"], opts) if decs else None  # one set for the contained candidates
    members["scratch"], decs["scratch"] = opts, _new_decoder(opts, tok, train_ids, z_train)
    hists, secs = train_decoders(list(decs.values()), [z_train] * len(decs), train_ids, opts, progress=opts.progress,
                                 desc=desc, batched=batched, epoch0=True, readouts=readouts,
                                 lr_scales=[None if k == "scratch" else shares for k in decs],
                                 race=[ce_1 if k == "scratch" else ce_c for k in decs])
    hist, secs = dict(zip(members, hists)), dict(zip(members, secs))
    ce = {k: _held_back_ce(h) for k, h in hist.items()}
    best = min((k for k in members if k != "scratch"), key=lambda k: ce[k], default=None)
    gains = {"contained": ce_c - ce[best] if best else -math.inf, "scratch": ce_1 - ce["scratch"]}
    kept = max(gains, key=lambda k: (gains[k], k == "contained"))  # a tie keeps the contained probe
    if gains[kept] <= 0:
        kept = "control"
    best = "scratch" if kept == "scratch" else best
    if kept == "control":  # the control's own function, at the probe's width
        dec = contain(_new_decoder(opts, tok, train_ids, z_train), dec_c)
        m = _scored(dec, opts, tok, z_eval, eval_ids).noted(run="the control's (nothing read beat it)")
        h_kept = list(hist.get("probe", hist["scratch"]))
    else:
        dec, m, h_kept = decs[best], _scored(decs[best], members[best], tok, z_eval, eval_ids), hist[best]
    if selects:
        m = m.noted(decoder_choice=_choice(opts, min(ce["probe"], ce["scratch"]), ce["plain"]))
    m = m.noted(start={"kept": kept, "control": ce_c, "control_first_run": ce_1,
                  "contained": min((ce[k] for k in members if k != "scratch"), default=None), "scratch": ce["scratch"],
                  "definition": "held-back CE (nats) of the control (its second run), of the probe started as the "
                                "trained control with a silent embedding pathway (its best epoch, the start "
                                "included), of the control's first run and of the probe trained from a random start; "
                                "kept: the probe furthest below its own control (the contained probe's: the second "
                                "run, the scratch probe's: the first), else the control"})
    if raced := {k: h["step"] for k, rows in hist.items() for h in rows if "raced" in h}:  # stopped by the race
        m = m.noted(start={**m.metrics["start"], "raced": raced})
    if kept == "scratch" and first_out[0] is None:  # the first run's scores are read only with a kept scratch probe
        first_out = (_scored(start, opts, tok, z_train.mean(0, keepdim=True).expand_as(z_eval), eval_ids),
                     *first_out[1:])
        if cache is not None:
            cache[key] = (*cache[key][:5], first_out[0], cache[key][6])
    return {"probe": (dec, m, h_kept, sum(secs.values())), "control": first_out if kept == "scratch" else control_out}


def _as_control(dec_c, opts, tok, train_ids, z_train, metrics, hist_c, whose: str):
    """The control as the probe of a constant embedding ``z_train``: its very decoder at the control's width, else
    the control's weights in a decoder of the embedding's width (:func:`contain`); its metrics and history."""
    if dec_c.config.embed_dim == z_train.shape[1]:
        dec = copy.deepcopy(dec_c)
        dec.set_normalization(z_train)  # its own constant standardised away (the control's was the mean)
    else:
        dec = contain(_new_decoder(opts, tok, train_ids, z_train), dec_c)
    return dec, metrics.noted(run=f"{whose} (a constant embedding)"), list(hist_c), 0.0


def _is_constant(z_train: torch.Tensor, z_eval: torch.Tensor) -> bool:
    """Whether every training and held-out embedding is one and the same vector."""
    first = z_train[:1]  # (1, D)
    return bool((z_train == first).all()) and bool((z_eval == first).all())


def fit_selected(opts, tok, train_ids, eval_ids, z_train, z_eval, desc: str = "probe decoder"):
    """:func:`fit_decoders` without a control: (decoder, metrics, history, seconds)."""
    return fit_decoders(opts, tok, train_ids, eval_ids, z_train, z_eval, desc=desc)["probe"]
