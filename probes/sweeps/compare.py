"""A comparison of read-outs on one encoder pass: ``memlab probe --compare llama,pretrained:memlab-lm,align``.

A *method* is a registered decoder (``llama``, ``pretrained:NAME``: a sequence decoder and its control) or a
registered read-out (``align``, ``bow``), optionally with options of its own in brackets:
``pretrained:memlab-lm[conditioning=prefix,prefix_len=8]``, ``align[align_target=space:NAME:PATH]``. In YAML,
``compare: [llama, "pretrained:memlab-lm[conditioning=prefix]", align]`` (or the same comma string). The chunks
are encoded once (at the largest ``n_train``), and every method is fitted at every size on the same cached
embeddings (:func:`memlab.probes.sweeps.layers.run_learning_curve`), exactly as a probe of that one method would fit it
(:func:`method_options` gives those single-method options, :func:`memlab.probes.options.compared` checks them; ``tests/probes/test_probe_compare.py`` checks the rows equal).

Options the encoder pass and its chunks fix (:data:`SHARED`) are the comparison's, never a method's. A global
option that belongs to one part (``lora_r`` to ``decoder=pretrained``, ``target_tokenizer`` to ``decoder=llama``,
``align_target`` to ``readouts=align``) goes to the methods it applies to; one that applies to none, or a bracket
option that does not apply to its method, is refused in one line.

**Targets.** Each decoder rebuilds the chunk texts in its targets' tokenizer (the scratch decoder: the encoder's,
or ``target_tokenizer``; a pretrained decoder: its own), the align read-out in its target space's (its decoder's
labels: the chunk's tokens and its end token). Bits per chunk count over those target tokens, so the table names
them on every row (``targets``, ``target_tokens``). To put the scratch decoder on a pretrained decoder's targets,
give it that tokenizer: ``llama[target_tokenizer=memlab-lm]``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from memlab.config import apply_overrides, from_dict
from memlab.errors import ConfigError
from memlab.plots import finish_axes, pyplot, save_figure
from memlab.probes.chunks.batch import mask_of
from memlab.probes.parts import PARTS, SELECTED_BY, chosen, get_part, split_name
from memlab.probes.readings import Reading, cell
from memlab.probes.report.report import jsonable
from memlab.tables import markdown_table

SHARED = frozenset({
    "model", "layer", "pool", "final_norm", "random_init", "special_tokens", "chunk_by", "seq_len",
    "max_chunk_tokens", "chunk_tokenizer", "n_train", "n_eval", "corpus", "text_field", "eval_split", "seed", "device",
    "encoder_dtype", "device_map", "max_memory", "offload_dir", "encode_batch_size", "cache_dir", "cache_dtype", "progress",
    "threads", "layers", "layers_sequence",
    "compare", "decoder", "readouts", "sequence", "calibrate", "ci_level", "ci_resamples"})
"""Options of the encoder pass, its chunks and the comparison itself: not a method's to set."""


@dataclass(frozen=True)
class Method:
    """One compared method: ``spec`` as written, ``kind`` (decoder or readout), its part ``name`` and its own
    ``key=value`` options."""

    spec: str
    kind: str
    name: str
    overrides: tuple[str, ...] = ()


def split_top(text: str) -> list[str]:
    """``"a,b[x=1,y=2],c"`` -> ``["a", "b[x=1,y=2]", "c"]``: commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise ConfigError(f"'compare': unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise ConfigError(f"'compare': unbalanced '[' in {text!r}")
    return out + [cur.strip()]


def parse_method(text: str) -> Method:
    """``"pretrained:memlab-lm[conditioning=prefix]"`` -> its :class:`Method` (unknown names refused)."""
    spec = str(text).strip()
    name, sep, rest = spec.partition("[")
    name = name.strip()
    if sep and not rest.endswith("]"):
        raise ConfigError(f"'compare': method {spec!r} must end with its options' ']'")
    over = tuple(o for o in split_top(rest[:-1]) if o) if sep else ()
    bad = [o for o in over if "=" not in o]
    if bad:
        raise ConfigError(f"'compare': method {spec!r}: options are key=value, got {bad[0]!r}")
    base = split_name(name)[0]
    for kind in ("decoder", "readout"):
        if base in PARTS[kind]:
            get_part(kind, name)  # its argument, as the option would check it
            return Method(spec, kind, name, over)
    raise ConfigError(f"'compare': unknown method {name!r}; a method is a decoder "
                      f"({', '.join(_spelled('decoder'))}) or a read-out ({', '.join(PARTS['readout'].names())})")


def _spelled(kind: str) -> list[str]:
    return [p.name + (f":{p.argument.split(':')[0]}" if p.argument else "")
            for p in (PARTS[kind].get(n) for n in PARTS[kind].names())]


def parse_methods(value) -> list[Method]:
    """``compare`` (a comma string or a list of method strings) -> its methods (each named once)."""
    items = split_top(value) if isinstance(value, str) else [str(v) for v in value]
    methods = [parse_method(x) for x in items if x]
    if not methods:
        raise ConfigError("'compare' names no method")
    seen = [m.spec for m in methods]
    dup = next((s for s in seen if seen.count(s) > 1), None)
    if dup:
        raise ConfigError(f"'compare' names {dup!r} twice")
    return methods


def owners(option: str) -> list[tuple[str, str]]:
    """The (kind, part name) of every registered part that ``option`` belongs to alone (empty: a general option)."""
    return [(k, n) for k in PARTS for n in PARTS[k].names() if option in PARTS[k].get(n).option_names]


def applies(opts, option: str) -> bool:
    """Whether ``option`` applies to the parts ``opts`` chooses (a general option always does)."""
    own = owners(option)
    return not own or any(k in SELECTED_BY and n in {split_name(c)[0] for c in chosen(opts, k)} for k, n in own)


def method_options(opts, method: Method, explicit: set[str]) -> tuple[object, set[str]]:
    """The options of a probe of ``method`` alone (and the options it sets): the comparison's ``opts`` with the
    method's part chosen, its bracket options applied, and every part option that does not apply to it back at
    its default."""
    cls = getattr(type(opts), "checked_from", type(opts))  # ProbeOptions: each method is checked as its own probe
    keys = [o.split("=", 1)[0].strip() for o in method.overrides]
    names = {f.name for f in fields(cls)}
    for k in keys:
        if k not in names:
            raise ConfigError(f"'compare': method {method.spec!r}: unknown option '{k}'")
        if k in SHARED:
            raise ConfigError(f"'compare': method {method.spec!r}: '{k}' is the comparison's (one encoder pass, "
                              "the same chunks for every method); set it outside the method")
    if method.kind == "decoder":
        base = replace(opts, compare=None, decoder=method.name, readouts=[], sequence=True)
    else:
        own = get_part("readout", method.name).option_names
        wrong = [k for k in keys if k not in own]
        if wrong:
            raise ConfigError(f"'compare': '{wrong[0]}' does not apply to the read-out {method.name!r} "
                              f"(it takes {', '.join(own) or 'no options'})")
        base = replace(opts, compare=None, readouts=[method.name], sequence=False)
    data = apply_overrides({f.name: getattr(base, f.name) for f in fields(cls)}, list(method.overrides))
    mine = from_dict(cls, data)
    defaults = cls()
    for k in names - set(keys):  # a part option of a part this method does not choose: back at its default
        if owners(k) and not applies(mine, k):
            setattr(mine, k, getattr(defaults, k))
    return mine, {k for k in explicit if applies(mine, k)} | set(keys)


def methods(opts, explicit: set[str] = frozenset()) -> list[tuple[Method, object, set[str]]]:
    """Every method of ``opts.compare`` with its single-method options and the options it sets (each is then
    checked as a probe of it alone: :func:`memlab.probes.options.compared`); a global option that applies to none
    of them is refused."""
    for k in ("decoder", "readouts", "sequence"):
        if k in explicit:
            raise ConfigError(f"'{k}' and 'compare' both choose what reads the embedding; name every decoder and "
                              "read-out in 'compare'")
    out = [(m, *method_options(opts, m, set(explicit))) for m in parse_methods(opts.compare)]
    for k in explicit:
        if owners(k) and not any(applies(o, k) for _, o, _ in out):
            raise ConfigError(f"'{k}' applies to none of the compared methods "
                              f"({', '.join(m.spec for m, _, _ in out)})")
    return out


def readout_name(opts) -> str | None:
    """The read-out a read-out method's options fit (None: a decoder method)."""
    return None if opts.sequence else opts.readouts[0]


@dataclass
class Cells:
    """The comparison's common columns of one fitted method (:func:`cells`)."""

    bits: Reading | None
    """Bits per chunk: the probe's over its control, or the read-out's over its prior."""
    tf1: Reading | None
    """Token-set F1 (a bag-of-words read-out: its recovered share of the token set)."""
    accuracy: Reading | None
    """Token accuracy (None for a read-out without a token-set F1)."""
    baseline_tf1: float | None
    """The control's TF1, or the read-out's prior."""
    targets: str | None
    """Whose tokens the bits are counted over."""
    target_tokens: int
    """How many held-out target tokens."""
    own: dict | None = None
    """The alignment read-out's target decoder on its own vectors."""

    def to_dict(self) -> dict:
        out = {"bits": jsonable(self.bits), "tf1": jsonable(self.tf1), "accuracy": jsonable(self.accuracy),
               "baseline_tf1": self.baseline_tf1, "targets": self.targets, "target_tokens": self.target_tokens}
        return {**out, "own": self.own} if self.own else out


def cells(fit, opts, targets) -> Cells:
    """The comparison's common columns of one fitted method (:class:`Cells`); ``targets`` names whose tokens the bits
    are counted over and gives the held-out ones."""
    r, name = fit.readings, readout_name(opts)
    if name is None:
        p, c = fit.probe, fit.control
        return Cells(r.get("bits_per_chunk"), r.get("token_set_f1"), r.get("token_accuracy"),
                     c["token_set_f1"] if c else None, targets.name, int(p["n_tokens"]))
    out = fit.readouts[name].values
    tf1 = r.get(f"{name}_token_set_f1") or r.get(f"{name}_recovered")  # bow: its recovered share of the token set
    return Cells(r.get(f"{name}_bits_per_chunk"), tf1,
                 r.get(f"{name}_recovered") if f"{name}_token_set_f1" in r else None,
                 out.get("prior_token_set_f1", out.get("prior")), out.get("target", targets.name),
                 int(out.get("n_tokens", mask_of(targets.eval_ids).sum())),
                 out.get("own") or None)  # align: its target decoder on its own vectors


def table(rows) -> str:
    """The comparison's markdown table: one row per method and size (:class:`memlab.probes.sweeps.layers.SweepRow`), with
    the intervals and the targets."""
    head = ["method", "n_train", "bits per chunk [95 % interval]", "TF1 [interval]", "baseline TF1",
            "token accuracy [interval]", "targets (held-out tokens)", "seconds"]
    lines = []
    for r in rows:
        c = r.cells
        base = f"{c.baseline_tf1:.3f}" if c.baseline_tf1 is not None else ""
        lines.append([r.method, str(r.n_train), cell(c.bits, gain=True), cell(c.tf1, gain=False), base,
                      cell(c.accuracy, gain=False), f"{c.targets or 'the encoder'} ({c.target_tokens})",
                      f"{r.seconds:.0f}"])
    return markdown_table(head, lines)


def plot(rows: list[dict], path, title: str):
    """One figure, two panels (bits per chunk, TF1) against training chunks on a log axis: one line per method,
    its 95 % interval as a band. ``rows``: as curve.json holds them."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in zip(axes, ("bits", "tf1"), ("bits per chunk", "TF1 (token-set F1)")):
        for spec in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == spec and r[key] is not None]
            if not mine:
                continue
            xs, ys = [r["n_train"] for r in mine], [r[key]["value"] for r in mine]
            lo, hi = [r[key]["low"] for r in mine], [r[key]["high"] for r in mine]
            line, = ax.plot(xs, ys, "-o", ms=4, label=spec)
            if len(xs) > 1:
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
            else:  # one size: its interval as an error bar
                ax.errorbar(xs, ys, yerr=[[ys[0] - lo[0]], [hi[0] - ys[0]]], fmt="none", capsize=4,
                            color=line.get_color())
        ax.set_xscale("log")
        if key == "bits":
            ax.axhline(0.0, color="grey", lw=0.8)
        finish_axes(ax, "training chunks", label, legend_fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)
