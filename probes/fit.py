"""The read-outs of one set of cached embeddings: sequence probe, control, bag-of-words, calibration.

:func:`fit_readings` is what :func:`memlab.probes.inversion.run_probe`, the
layer sweep and the learning curve (:mod:`memlab.probes.sweep`) fit on
embeddings already computed: ``z_train`` (N, D) of ``train_ids`` (N, T) and
``z_eval`` (M, D) of ``eval_ids`` (M, T).

Calibration (``report["calibration"]``): a probe of a synthetic encoder
(:mod:`memlab.probes.synthetic`) is checked against what it must read
(``concat``: token accuracy >= 0.99; ``bag``: token-set F1 of the bag-of-words read-out >= 0.9;
``constant``: the interval of its information gain holds 0; with the alignment read-out also
:func:`check_align`). With ``calibrate=True`` a
probe of any model also fits the same decoder on ``synthetic:concat`` codes
and the bag-of-words read-out on ``synthetic:bag`` codes of the same chunks
in the model's own tokenizer: when these positive controls fail, the report
says that the probe could not see, not that the model forgot.
"""

from __future__ import annotations

import torch

from memlab.probes import train as T
from memlab.probes.group import train_decoders
from memlab.probes.options import ProbeOptions
from memlab.probes.scores import limit_line, reconstruction_scores

EXPECT = {"concat": ("token_accuracy", 0.99), "bag": ("bow_token_set_f1", 0.9), "constant": ("information_gain", 0.01)}
"""What a working probe reads from each synthetic encoder: (metric, threshold). For ``bag`` the set is read by the
bag-of-words read-out: its top-k at the chunk's own k is a token-set F1 (precision = recall there); a decoder
that emits every position at once cannot spread an order-free set over positions (it repeats the likeliest
token), so its TF1 is reported but not the test."""


PLAIN_INPUT_DROPOUT = ProbeOptions.plain_input_dropout
"""Input dropout of the plain decoder that :func:`fit_decoders` fits beside the bag-head decoder (the default of
``plain_input_dropout``): with it, teacher inputs read synthetic concat whole at 8,000 chunks of 32 tokens
instead of over-fitting their own language model (the measurements: docs/probes.md, "Calibration")."""


def _held_back_ce(history: list[dict]) -> float:
    best = [h["best_val_ce"] for h in history if "best_val_ce" in h]
    return best[-1] if best else float("inf")


def _new_decoder(opts, tok, train_ids, z_train):
    dec = T.build_decoder(z_train.shape[1], tok, train_ids, opts, compact=opts.compact_vocab)
    dec.set_normalization(z_train)
    return dec


def _scored(dec, opts, tok, z_eval, eval_ids) -> dict:
    metrics = T.evaluate(dec, z_eval, eval_ids)
    metrics.update(reconstruction_scores(dec, z_eval, eval_ids, tok, opts.scorers))
    return metrics


def fit_decoders(opts, tok, train_ids, eval_ids, z_train, z_eval, control: bool = False, cache: dict | None = None,
                 key: str | None = None, owner: str | None = None, desc: str = "probe decoder",
                 batched: bool | None = None) -> dict:
    """The sequence decoders of one set of embeddings, trained as one group (:mod:`memlab.probes.group`: one batched
    pass, the same batches, each its own optimiser state and early stopping):

    * the probe decoder on (z_train, train_ids);
    * with ``select_decoder`` (and a bag head, and a held-back share) the plain decoder (no bag head, input dropout
      ``plain_input_dropout``): the one with the lower held-back CE is kept. The bag head reads content a
      positional read-out cannot learn from few chunks (MiniLM: information gain 0.135 with it, 0.003 without); it
      slows the positional read-out of an embedding that keeps every position (concat: 0.888 with it, 0.991
      without). Choosing on held-back chunks keeps the held-out reading honest; only the kept one is scored;
    * with ``control`` the control: the same decoder on the mean training embedding for every chunk. It depends on
      the token data and decoder options only (the decoder's standardisation turns the mean into exact zeros), so
      probes of the same chunks share one through ``cache`` (keyed by ``key``); when cached it is not trained.

    Returns ``{"probe": (decoder, held-out metrics, history, seconds), "control": (metrics, history, seconds, name
    of the probe that trained it or None) or None}``; ``metrics["decoder_choice"]`` says which decoder was kept
    and why. Seconds: the group's, split over its members by the steps each ran.
    """
    from dataclasses import replace

    selects = opts.select_decoder and opts.bag_head and opts.val_fraction > 0  # a plain decoder to choose from
    if control and cache is not None and key in cache and _is_constant(z_train, z_eval) and not selects and (
            cache[key][3].config.embed_dim == z_train.shape[1]):  # a control of the same width: its very decoder
        # a constant embedding standardises to the control's exact zeros, and the probe starts from the control's
        # weights, batches and noise: its run is the cached control's, bit for bit (tests/test_probe_group.py)
        import copy

        metrics, hist_c, owner_, dec_c = cache[key]
        dec_c = copy.deepcopy(dec_c)
        dec_c.set_normalization(z_train)  # its own constant standardised away (the control's was the mean)
        same = {**metrics, "run": "the cached control's (a constant embedding)"}
        return {"probe": (dec_c, same, list(hist_c), 0.0), "control": (metrics, hist_c, 0.0, owner_)}
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
                                 progress=opts.progress, desc=desc if len(members) == 1 else what, batched=batched)
    hist, secs = dict(zip(members, hists)), dict(zip(members, secs))
    kept = "probe"
    if "plain" in members:
        ce, ce2 = _held_back_ce(hist["probe"]), _held_back_ce(hist["plain"])
        kept = "plain" if ce2 < ce else "probe"
        choice = {"bag_head": ce, "plain": ce2, "kept": "plain" if kept == "plain" else "bag_head",
                  "definition": "held-back CE (nats) of the decoder with the bag head and of the plain decoder (no "
                                f"bag head, input dropout {opts.plain_input_dropout}); the lower is kept"}
    m = _scored(decs[kept], members[kept][0], tok, z_eval, eval_ids)
    if "plain" in members:
        m["decoder_choice"] = choice
    out = {"probe": (decs[kept], m, hist[kept], secs["probe"] + secs.get("plain", 0.0)), "control": None}
    if cached:
        metrics, hist_c, owner_, _ = cache[key]
        out["control"] = (metrics, hist_c, 0.0, owner_)
    elif control:
        mc = _scored(decs["control"], opts, tok, members["control"][2], eval_ids)
        if cache is not None:
            cache[key] = (mc, hist["control"], owner, decs["control"])
        out["control"] = (mc, hist["control"], secs["control"], None)
    return out


def _is_constant(z_train: torch.Tensor, z_eval: torch.Tensor) -> bool:
    """Whether every training and held-out embedding is one and the same vector."""
    first = z_train[:1]  # (1, D)
    return bool((z_train == first).all()) and bool((z_eval == first).all())


def fit_selected(opts, tok, train_ids, eval_ids, z_train, z_eval, desc: str = "probe decoder"):
    """:func:`fit_decoders` without a control: (decoder, metrics, history, seconds)."""
    return fit_decoders(opts, tok, train_ids, eval_ids, z_train, z_eval, desc=desc)["probe"]


def fit_bow_readout(train_ids, eval_ids, z_train, z_eval, seed: int = 0, name: str = "bow", context=None,
                    device: str = "cpu") -> dict:
    """The registered read-out ``name`` (default the bag of words) fitted on ``device`` and scored, with its seconds;
    a read-out that takes a ``context`` keyword gets ``context`` (:class:`memlab.probes.parts.ReadoutContext`)."""
    from memlab.probes.parts import get_part, takes_context

    impl = get_part("readout", name).impl
    kw = {"context": context} if takes_context(impl) else {}
    with T.Timer() as t:
        out = impl(z_train, train_ids, z_eval, eval_ids, seed=seed, device=device, **kw)
    out["seconds"] = t.seconds
    return out


def _check(control: str, metric: str, value, passed: bool, needs: str, **extra) -> dict:
    return {"control": control, "metric": metric, "value": value, "needs": needs, "passed": passed, **extra}


def _verdict(checks: list[dict]) -> dict:
    return {"status": "passed" if all(c["passed"] for c in checks) else "failed", "checks": checks}


ALIGN_SLACK = 0.05
"""The alignment read-out's positive control: of a synthetic encoder that keeps every token (``concat``) it reads at
least its target's own reading of the same chunks less this much (the map loses no more); of ``constant`` its gain's
interval holds 0."""


def check_align(kind: str, readings: dict) -> list[dict]:
    """The alignment read-out's checks on a synthetic encoder (:data:`ALIGN_SLACK`); none when it was not fitted."""
    a = (readings.get("readouts") or {}).get("align")
    if not a or kind == "bag":  # a bag keeps no order: what a target that reads sequences makes of it is not known
        return []
    name = f"synthetic:{kind} (align read-out into {a.get('target', 'its target')})"
    if kind == "constant":
        r = (readings.get("readings") or {}).get("align_gain")
        if r is None:
            return []
        return [_check(name, "align gain", r["value"], r["low"] <= 0.0 <= r["high"], "its interval holds 0",
                       interval=[r["low"], r["high"]])]
    own = (a.get("own") or {}).get("recovered")
    if own is None:
        return []
    return [_check(name, "recovered", a["recovered"], a["recovered"] >= own - ALIGN_SLACK,
                   f"recovered >= its target's own {own:.3f} - {ALIGN_SLACK}", own=own, r2=a["own"].get("r2"))]


def check_synthetic(kind: str, readings: dict) -> dict:
    """Calibration of a synthetic encoder's own probe: its metric against its threshold (:data:`EXPECT`), and the
    alignment read-out's checks when it was fitted (:func:`check_align`)."""
    got = _check_synthetic(kind, readings)
    extra = check_align(kind, readings)
    if not extra:
        return got
    if got["status"] == "unchecked":
        return {**_verdict(extra), "note": got["note"]}
    return _verdict(got["checks"] + extra)


def _check_synthetic(kind: str, readings: dict) -> dict:
    metric, thr = EXPECT[kind]
    name, bow = f"synthetic:{kind}", readings.get("bow")
    if metric == "bow_token_set_f1" and bow:
        value = bow["recovered"]
        return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])
    missing = ("the bag-of-words read-out (readouts=[bow, ...])" if metric == "bow_token_set_f1" and not bow else
               "the control (control=true)" if metric == "information_gain" and readings.get("probe") is not None
               and readings.get("information_gain") is None else None)
    if missing or (readings.get("probe") is None and not bow):
        fits = missing or ("the sequence probe (sequence=true) or the bag-of-words read-out" if kind == "concat"
                           else "the bag-of-words read-out")
        return {"status": "unchecked", "checks": [], "note": f"{name} is checked by {fits}, which this probe did not fit"}
    if readings.get("probe") is None:  # no sequence probe (a BoW-only sweep): the read-out's share or gain
        if kind == "constant":
            value = bow["gain"]
            return _verdict([_check(name, "bow gain", value, abs(value) <= thr, f"bow gain |x| <= {thr}")])
        value, thr = bow["recovered"], EXPECT["bag"][1]
        return _verdict([_check(name, "bow recovered", value, value >= thr, f"bow recovered >= {thr}")])
    if metric == "information_gain":
        value, r = readings.get("information_gain"), (readings.get("readings") or {}).get("information_gain")
        if r is not None:  # nothing is there to read: the interval must hold 0
            return _verdict([_check(name, metric, value, r["low"] <= 0.0 <= r["high"],
                                    "its interval holds 0", interval=[r["low"], r["high"]])])
        return _verdict([_check(name, metric, value, value is not None and abs(value) <= thr,
                                f"|information gain| <= {thr}")])
    value = readings["probe"][metric]
    return _verdict([_check(name, metric, value, value >= thr, f"{metric} >= {thr}")])


def _codes(kind: str, tok, ids: torch.Tensor) -> torch.Tensor:
    """Synthetic ``kind`` embeddings (N, D) of chunks ``ids`` (N, T) in their own tokenizer."""
    from memlab.probes.synthetic import SyntheticEncoder

    from memlab.probes.chunks import fill_pad, mask_of

    return SyntheticEncoder(kind, tok, max_len=ids.shape[1]).encode(fill_pad(ids), mask_of(ids).long())


def calibrate_on(opts, tok, train_ids, eval_ids) -> dict:
    """Positive controls in the model's tokenizer on the same chunks: concat (sequence decoder), bag (BoW)."""
    _, m, _, secs = fit_selected(opts, tok, train_ids, eval_ids, _codes("concat", tok, train_ids),
                                 _codes("concat", tok, eval_ids), desc="calibration decoder")
    b = fit_bow_readout(train_ids, eval_ids, _codes("bag", tok, train_ids), _codes("bag", tok, eval_ids),
                        seed=opts.seed, device=opts.device)
    (m_concat, t_concat), t_bag = EXPECT["concat"], EXPECT["bag"][1]
    return _verdict([
        _check("synthetic:concat", m_concat, m[m_concat], m[m_concat] >= t_concat, f"{m_concat} >= {t_concat}",
               seconds=secs),
        _check("synthetic:bag (bag-of-words read-out)", "recovered", b["recovered"], b["recovered"] >= t_bag,
               f"recovered >= {t_bag}", seconds=b["seconds"]),
    ])


def calibration(opts, tok, train_ids, eval_ids, readings: dict) -> dict:
    """The report's calibration section (see the module doc)."""
    if opts.model.startswith("synthetic:"):
        return check_synthetic(opts.model.split(":")[1], readings)
    if opts.calibrate and readings.get("probe"):
        return calibrate_on(opts, tok, train_ids, eval_ids)
    return {"status": "unchecked", "checks": [],
            "note": "positive controls not run on these chunks (calibrate=true, or the quickstart's calibration rows)"}


def _public(m: dict | None) -> dict | None:
    """A metrics dict without its per-chunk arrays (keys starting with ``_``)."""
    return None if m is None else {k: v for k, v in m.items() if not k.startswith("_")}


def interval_readings(opts, eval_ids, tok, probe, control, bow, chars=None, readouts: dict | None = None) -> dict:
    """:func:`memlab.probes.intervals.readings` of fitted metrics (their ``_per_chunk`` parts); ``readouts``: every
    fitted read-out by name (``bow`` among them or given alone)."""
    from memlab.probes.chunks import chunk_chars
    from memlab.probes.intervals import readings

    chars = chars if chars is not None else chunk_chars(eval_ids, tok)
    per = {k: v["_per_chunk"] for k, v in (readouts or {}).items() if k != "bow" and v.get("_per_chunk")}
    return readings((probe or {}).get("_per_chunk"), (control or {}).get("_per_chunk"), chars,
                    (probe or {}).get("_tf1"), (control or {}).get("_tf1"), (bow or {}).get("_per_chunk"),
                    n_resamples=opts.ci_resamples, level=opts.ci_level, seed=opts.seed, readouts=per)


def _decoded(opts, tok, train_ids, eval_ids, bow: bool):
    """(training, held-out) texts as the chunks' tokens decode, when a chosen read-out reads text; else None."""
    from memlab.probes.chunks import rows
    from memlab.probes.parts import get_part, takes_context

    if not (bow and any(takes_context(get_part("readout", n).impl) for n in opts.readouts)):
        return None
    return tuple(tok.batch_decode(rows(x), skip_special_tokens=True) for x in (train_ids, eval_ids))


def readout_context(opts, tok, texts, dim: int | None = None):
    """The :class:`memlab.probes.parts.ReadoutContext` of chunks whose texts are ``texts`` (train, held-out)."""
    from memlab.probes.parts import ReadoutContext

    tr, ev = texts if texts is not None else (None, None)
    return ReadoutContext(texts_train=tr, texts_eval=ev, tokenizer=tok, dim=dim, opts=opts)


def fit_readings(opts, tok, train_ids, eval_ids, z_train, z_eval, control_cache: dict | None = None,
                 control_key: str | None = None, sequence: bool = True, bow: bool = True, chars=None,
                 texts=None) -> dict:
    """Sequence probe and control (``sequence``), the read-outs (``bow``: ``opts.readouts``), intervals, calibration,
    limit line.

    ``chars``: characters of each held-out chunk's text (default: as its tokens decode); ``texts``: (training texts,
    held-out texts) of the chunks, for read-outs that read text (default: as the tokens decode). Returns a dict with
    probe, control, information_gain, bow, readings (paired bootstrap intervals, :mod:`memlab.probes.intervals`),
    retention, limited_by, calibration, history, timing and ``_decoder`` (the fitted sequence decoder, or None).
    """
    from memlab.probes.intervals import retention

    out = {"probe": None, "control": None, "information_gain": None, "control_shared_with": None, "bow": None,
           "limited_by": None, "history": {"probe": [], "control": []}, "_decoder": None,
           "timing": {"train_s": 0.0, "control_s": 0.0, "bow_s": 0.0}}
    if sequence:
        got = fit_decoders(opts, tok, train_ids, eval_ids, z_train, z_eval, control=opts.control,
                           cache=control_cache, key=control_key, owner=opts.model)
        dec, out["probe"], out["history"]["probe"], out["timing"]["train_s"] = got["probe"]
        out["_decoder"] = dec
        if opts.control:
            c, out["history"]["control"], out["timing"]["control_s"], out["control_shared_with"] = got["control"]
            out["control"] = c
            out["information_gain"] = T.information_gain(out["probe"]["ce"], c["ce"])
        out["limited_by"] = limit_line(out["probe"], out["control"])
    out["readouts"] = {}
    context = readout_context(opts, tok, texts or _decoded(opts, tok, train_ids, eval_ids, bow), int(z_train.shape[1]))
    for name in opts.readouts if bow else []:
        out["readouts"][name] = fit_bow_readout(train_ids, eval_ids, z_train, z_eval, seed=opts.seed, name=name,
                                                context=context, device=opts.device)
        out["timing"]["bow_s"] += out["readouts"][name]["seconds"]
    out["bow"] = out["readouts"].get("bow")
    out["readings"] = interval_readings(opts, eval_ids, tok, out["probe"], out["control"], out["bow"], chars,
                                        out["readouts"])
    out["retention"] = retention(out["readings"], opts.ci_level)
    out["_reconstruction"] = (out["probe"] or {}).get("_reconstruction")
    for k in ("probe", "control", "bow"):
        out[k] = _public(out[k])
    out["readouts"] = {k: _public(v) for k, v in out["readouts"].items()}
    out["calibration"] = calibration(opts, tok, train_ids, eval_ids, out)
    return out
