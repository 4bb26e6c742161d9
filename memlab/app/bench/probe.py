"""Part (d): the inversion probe's time split: the frozen encoder's pass over the data vs the
decoder's training (and the control decoder), from the probe report's own timers.

Runs ``memlab.probes`` on the packaged all-MiniLM-L6-v2 (no download) with a bounded
number of chunks and epochs; the split, not the absolute time, is the result.
"""

from __future__ import annotations

from typing import Any


def run_probe_split(device, quick: bool = False, log=print, model: str = "minilm", n_train: int = 512,
                    epochs: float = 2.0, out_dir=None) -> dict[str, Any]:
    try:
        from memlab.probes.inversion import load_options, run_probe
    except ImportError:
        return {"skipped": "memlab.probes is not installed"}
    from memlab.errors import MemlabError

    kw = dict(model=model, n_train=32 if quick else n_train, n_eval=16 if quick else 128, epochs=1.0 if quick else epochs,
              seq_len=16 if quick else 32, hidden_size=32 if quick else 128, device=str(device), progress=False,
              control=not quick, n_examples=1, val_fraction=0.0)  # every epoch runs: no early stopping
    try:
        opts = load_options(None, **kw)
        report = run_probe(opts, out_dir)
    except (MemlabError, OSError, RuntimeError) as e:
        return {"error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]}", "options": kw}
    t = report.timing
    res = {"model": model, "options": kw, "encode_s": t["encode_s"], "decoder_train_s": t["train_s"],
           "control_train_s": t.get("control_s") or 0.0, "load_s": t["load_s"], "total_s": t["total_s"],
           "encode_cached": t.get("encode_cached")}
    work = res["encode_s"] + res["decoder_train_s"] + res["control_train_s"]
    res["encode_share"] = res["encode_s"] / work if work else None
    log(f"probe split: encode {res['encode_s']:.2f}s, decoder {res['decoder_train_s']:.2f}s, "
        f"control {res['control_train_s']:.2f}s")
    return res
