"""Fit the probe's decoders: build them, train them as one group, score them on the held-out chunks.

:func:`fit_decoders` is the probe run's decoder step: the probe decoder, with ``select_decoder`` the plain decoder
beside it, and the control (the same decoder on a constant embedding) are built from the same seed and trained
together by :func:`memlab.probes.decoder.fitloop.train_decoders` (one loop: the same batches, optimiser, schedule and early
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
from memlab.probes.chunks.batch import fill_pad, mask_of, shift_right, trim
from memlab.probes.decoder.model import ProbeDecoder
from memlab.probes.decoder.build import build_decoder
from memlab.probes.decoder.fitloop import train_decoders
from memlab.probes.parts import get_part
from memlab.probes.readings import ChunkScores, DecoderScores, reconstruction_scores
from memlab.probes.decoder.records import ControlEntry, ControlRun, ControlStore, DecoderFit, FitData, Fitted, Loop


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


def _new_decoder(opts, data: FitData):
    dec = build_decoder(data.z_train.shape[1], data.tok, data.train_ids, opts, compact=opts.compact_vocab,
                        table=data.table)
    dec.set_normalization(data.z_train)
    return dec


def _scored(dec, opts, data: FitData) -> DecoderScores:
    """The held-out scores of ``dec`` on ``data``: teacher-forced (:func:`evaluate`) and of its reconstructions."""
    return evaluate(dec, data.z_eval, data.eval_ids).with_reconstruction(
        reconstruction_scores(dec, data.z_eval, data.eval_ids, data.tok, opts.scorers, opts))


def _train(decs: list, zs: list, opts, data: FitData, loop: Loop, **kw):
    """:func:`memlab.probes.decoder.fitloop.train_decoders` of ``decs`` on embeddings ``zs`` and ``data``'s targets."""
    return train_decoders(decs, zs, data.train_ids, opts, progress=opts.progress, desc=kw.pop("desc", loop.desc),
                          batched=loop.batched, **kw)


def fit_decoders(opts, data: FitData, control: ControlStore | None = None, readouts: tuple = (),
                 desc: str = "probe decoder", batched: bool | None = None) -> DecoderFit:
    """The sequence decoders of one set of embeddings, trained as one group (:mod:`memlab.probes.decoder.fitloop`: one batched
    pass, the same batches, each its own optimiser state and early stopping):

    * the probe decoder on (z_train, train_ids);
    * with ``select_decoder`` (and a bag head, and a held-back share) the plain decoder (no bag head, input dropout
      ``plain_input_dropout``): the one with the lower held-back CE is kept. The bag head reads content a
      positional read-out cannot learn from few chunks; it slows the positional read-out of an embedding that
      keeps every position (measurements: docs/results/probes.md). Choosing on held-back chunks keeps the held-out
      reading honest; only the kept one is scored;
    * with ``control`` (a :class:`ControlStore`) the control: the same decoder on the mean training embedding for
      every chunk. It depends on the token data and decoder options only (the decoder's standardisation turns the
      mean into exact zeros), so probes of the same chunks share one through the store; when stored it is not
      trained. With a control and held-back chunks the fit has two phases (:func:`_fit_contained`): the control
      first, then the probe started as the trained control (:func:`contain`), its start counted as epoch 0, beside
      the probe trained from a random start; ``scores["start"]`` says which was kept (``control``: epoch 0,
      ``contained``, ``scratch``). Without held-back chunks all are trained together from their random starts.

    ``readouts``: read-out members (:func:`memlab.probes.decoder.fitloop.train_members`) trained in the probe's group, beside
    the probe decoders; one left untrained (``history`` empty: no probe was trained, the probe is the control of a
    constant embedding) is the caller's to train. ``scores.metrics["decoder_choice"]`` says which decoder was kept
    and why. Seconds: the group's, split over its members by the steps each ran.
    """
    loop = Loop(desc, batched, tuple(readouts))
    stored = control.get() if control is not None else None
    if stored is not None and _is_constant(data):
        # a constant embedding standardises to the control's exact zeros: nothing to read, the probe is the control
        return DecoderFit(_as_control(stored, opts, data, "the cached control's"),
                          ControlRun(stored.scores, stored.history, 0.0, stored.owner))
    if control is not None and opts.val_fraction > 0:  # without held-back chunks: trained together from scratch
        return _fit_contained(opts, data, control, loop)
    const = data.constant()
    members = {"probe": (opts, data)}
    if _selects(opts):
        members["plain"] = (_plain(opts), data)
    if control is not None and stored is None:
        members["control"] = (opts, const)
    decs = {k: _new_decoder(o, d) for k, (o, d) in members.items()}
    what = " and ".join(members) + (" decoders" if len(members) > 1 else " decoder")
    hists, secs = _train(list(decs.values()), [d.z_train for _, d in members.values()], opts, data, loop,
                         desc=loop.desc if len(members) == 1 else what, readouts=loop.readouts)
    hist, secs = dict(zip(members, hists)), dict(zip(members, secs))
    kept = "probe"
    if "plain" in members:
        ce, ce2 = _held_back_ce(hist["probe"]), _held_back_ce(hist["plain"])
        kept = "plain" if ce2 < ce else "probe"
        choice = _choice(opts, ce, ce2)
    m = _scored(decs[kept], members[kept][0], data)
    if "plain" in members:
        m = m.noted(decoder_choice=choice)
    out = DecoderFit(Fitted(decs[kept], m, hist[kept], secs["probe"] + secs.get("plain", 0.0)))
    if stored is not None:
        out.control = ControlRun(stored.scores, stored.history, 0.0, stored.owner)
    elif control is not None:
        mc = _scored(decs["control"], opts, const)
        control.put(ControlEntry(mc, hist["control"], control.owner, decs["control"], decs["control"], mc,
                                 hist["control"]))
        out.control = ControlRun(mc, hist["control"], secs["control"])
    return out


def _selects(opts) -> bool:
    """Whether a plain decoder is fitted beside the probe's bag-head one, to choose from on held-back chunks."""
    return opts.select_decoder and opts.bag_head and opts.val_fraction > 0


def _plain(opts):
    """The options of the plain decoder: no bag head, input dropout ``plain_input_dropout``."""
    return replace(opts, bag_head=False, input_dropout=opts.plain_input_dropout)


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


def _train_control(opts, data: FitData, control: ControlStore, loop: Loop) -> tuple[ControlEntry, float, float]:
    """The control of :func:`_fit_contained`, trained in two runs (see there) and stored; with the seconds of each
    run."""
    const = data.constant()
    start = _new_decoder(opts, const)
    (hist_1,), (secs_1,) = _train([start], [const.z_train], opts, data, loop, desc="control decoder")
    dec_c = contain(_new_decoder(opts, const), start)
    (hist_2,), (secs_2,) = _train([dec_c], [const.z_train], opts, data, loop, desc="control decoder (second run)",
                                  epoch0=True, lr_scales=[contained_shares(dec_c, opts)])
    hist_c = hist_1 + [{**h, "run": 2} for h in hist_2]
    entry = ControlEntry(_scored(dec_c, opts, const), hist_c, control.owner, dec_c, start, None, hist_1)
    control.put(entry)  # the first run's scores: computed when read
    return entry, secs_1, secs_2


def _fit_contained(opts, data: FitData, control: ControlStore, loop: Loop) -> DecoderFit:
    """:func:`fit_decoders` with a control and held-back chunks, in two phases.

    1. The control: trained from its random start (the *start* decoder), then trained again from there as the probe
       will be (epoch 0 counted, its weights at ``contained_lr``: :func:`contained_shares`), so that the probe gets
       no training the control did not get; the second run is the control the probe is read against. Stored as a
       :class:`ControlEntry`; the first run's scores are None until a kept scratch probe reads them (its greedy
       reconstruction costs seconds).
    2. The probe (and the plain decoder with ``select_decoder``) started as the start decoder with a silent
       embedding pathway (:func:`contain`), its pathway at the full learning rate and the rest at ``contained_lr``,
       trained with epoch 0 beside the probe trained from its own random start (the *scratch* candidate, all at the
       full rate), in one loop, with the read-out members.

    Each candidate is read against the control trained as much as it was: the contained probe against the second
    run, the scratch probe against the first. Kept: the candidate whose held-back CE lies furthest below its own
    control's (a tie keeps the contained probe); when neither lies below, the control itself (its function at the
    probe's width: exactly 0 bits). The kept probe's held-back CE is never above the control it is read against. On
    a constant embedding the contained probe's run is the control's second run, weight for weight. A decoder part
    that does not honour ``contained_lr`` (or has no embedding pathway) is fitted from its random start alone."""
    entry = control.get()
    if entry is not None:
        control_out = ControlRun(entry.scores, entry.history, 0.0, entry.owner)
        first_out = ControlRun(entry.first_scores, entry.first_history, 0.0, entry.owner)
    else:
        entry, secs_1, secs_2 = _train_control(opts, data, control, loop)
        control_out = ControlRun(entry.scores, entry.history, secs_1 + secs_2)
        first_out = ControlRun(None, entry.first_history, secs_1)
    if _is_constant(data):
        return DecoderFit(_as_control(entry, opts, data, "the control's"), control_out)
    members = {"probe": opts}
    if _selects(opts):
        members["plain"] = _plain(opts)
    decs = {k: _new_decoder(o, data) for k, o in members.items()}
    honours = "contained_lr" in get_part("decoder", opts.decoder).honoured("decoder")
    if not honours or not all(callable(getattr(d, "embedding_weights", None)) for d in decs.values()):
        members, decs = {}, {}  # a decoder kind without an embedding pathway to silence: the scratch probe alone
    for d in decs.values():
        contain(d, entry.start)
    shares = contained_shares(decs["probe"], opts) if decs else None  # one set for the contained candidates
    members["scratch"], decs["scratch"] = opts, _new_decoder(opts, data)
    ce_c, ce_1 = _held_back_ce(entry.history), _held_back_ce(entry.first_history)  # what each candidate is read against
    hists, secs = _train(list(decs.values()), [data.z_train] * len(decs), opts, data, loop, epoch0=True,
                         readouts=loop.readouts, lr_scales=[None if k == "scratch" else shares for k in decs],
                         race=[ce_1 if k == "scratch" else ce_c for k in decs])
    hist, secs = dict(zip(members, hists)), dict(zip(members, secs))
    ce = {k: _held_back_ce(h) for k, h in hist.items()}
    kept, best = _kept(members, ce, ce_c, ce_1)
    if kept == "control":  # the control's own function, at the probe's width
        dec = contain(_new_decoder(opts, data), entry.control)
        m = _scored(dec, opts, data).noted(run="the control's (nothing read beat it)")
        h_kept = list(hist.get("probe", hist["scratch"]))
    else:
        dec, m, h_kept = decs[best], _scored(decs[best], members[best], data), hist[best]
    if _selects(opts):
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
    if kept == "scratch" and first_out.scores is None:  # the first run's scores: read only with a kept scratch probe
        entry.first_scores = first_out.scores = _scored(entry.start, opts, data.constant())
        control.put(entry)
    return DecoderFit(Fitted(dec, m, h_kept, sum(secs.values())), first_out if kept == "scratch" else control_out)


def _kept(members: dict, ce: dict, ce_c: float, ce_1: float) -> tuple[str, str | None]:
    """(which start is kept: contained, scratch or control; the kept candidate's name): the candidate furthest below
    its own control (the contained ones' the second run ``ce_c``, the scratch one's the first ``ce_1``), a tie
    keeping the contained probe; the control when none lies below."""
    best = min((k for k in members if k != "scratch"), key=lambda k: ce[k], default=None)
    gains = {"contained": ce_c - ce[best] if best else -math.inf, "scratch": ce_1 - ce["scratch"]}
    kept = max(gains, key=lambda k: (gains[k], k == "contained"))
    if gains[kept] <= 0:
        return "control", best
    return kept, "scratch" if kept == "scratch" else best


def _as_control(entry: ControlEntry, opts, data: FitData, whose: str) -> Fitted:
    """The control as the probe of a constant embedding: its very decoder at the control's width, else the
    control's weights in a decoder of the embedding's width (:func:`contain`); its scores and history."""
    if entry.control.config.embed_dim == data.z_train.shape[1]:
        dec = copy.deepcopy(entry.control)
        dec.set_normalization(data.z_train)  # its own constant standardised away (the control's was the mean)
    else:
        dec = contain(_new_decoder(opts, data), entry.control)
    return Fitted(dec, entry.scores.noted(run=f"{whose} (a constant embedding)"), list(entry.history), 0.0)


def _is_constant(data: FitData) -> bool:
    """Whether every training and held-out embedding is one and the same vector."""
    first = data.z_train[:1]  # (1, D)
    return bool((data.z_train == first).all()) and bool((data.z_eval == first).all())


def fit_selected(opts, data: FitData, desc: str = "probe decoder") -> Fitted:
    """:func:`fit_decoders` without a control: the kept probe decoder."""
    return fit_decoders(opts, data, desc=desc).probe
