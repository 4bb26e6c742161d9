"""Checkpoints: ``save_pretrained`` weights (safetensors) plus trainer state,
written to a temporary folder and renamed, so a killed run never leaves a
half-written checkpoint behind.

Layout of ``RUN/checkpoints/step-00000100/``::

    config.json, model.safetensors     the model (save_pretrained)
    tokenizer files                    when the recipe has a tokenizer
    optimizer.pt, scheduler.pt         torch.save'd state dicts (loaded with weights_only=True)
    rng-RANK.pt                        RNG states of each process (torch CPU and CUDA, python, numpy)
    scaler.pt                          the fp16 gradient scaler, when there is one
    trainer_state.json                 step, data position, last evaluation, callback state
    manifest.json                      size and SHA-256 of every file above, written last

A checkpoint is written only from finite weights. :func:`verify_checkpoint`
checks a checkpoint against its manifest; :func:`newest_intact_checkpoint`
is what ``--resume``, ``memlab generate`` and ``memlab probe`` of a run load:
a damaged newer checkpoint is named in one line and renamed ``step-N.damaged``
(kept, never deleted; left in place while another process holds the run).
A checkpoint without a manifest (saved before manifests) is used with one
warning that its files are not checked. Writes go through
:func:`memlab.rundir.guarded`: a failed save removes its temporary folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from memlab.errors import MemlabError, ModelError
from memlab.outdir import check_room
from memlab.rundir import sync_tree

CKPT_PREFIX = "step-"
MANIFEST = "manifest.json"
DAMAGED = ".damaged"
"""Suffix of a damaged checkpoint moved aside when a newer-but-damaged one is skipped (never deleted)."""


class NonFiniteWeights(MemlabError):
    """The model holds NaN or infinite weights: nothing is saved."""


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX) and "." not in p.name
             and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CKPT_PREFIX):]))


def rng_state() -> dict[str, Any]:
    """This process's RNG states, in types that ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state()
    py = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and SHA-256 of every file of a checkpoint folder (written last)."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1))
    sync_tree(folder)  # every file on the disk before the folder is renamed into place


_VERIFIED: dict[tuple, str | None] = {}  # (folder, file sizes and times) -> verdict: each checkpoint is hashed once
_WARNED: set[str] = set()


def verify_checkpoint(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint (one phrase), or None when it matches its manifest (cached per process)."""
    ckpt = Path(ckpt)
    try:
        key = (str(ckpt.resolve()),) + tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                                                    for p in ckpt.rglob("*") if p.is_file()))
    except OSError:
        return _verify(ckpt)
    if key not in _VERIFIED:
        _VERIFIED[key] = _verify(ckpt)
    return _VERIFIED[key]


def _verify(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint (one phrase), or None when it matches its manifest.

    A checkpoint saved before manifests existed is not checked (its files are
    still read with one-line errors).
    """
    ckpt = Path(ckpt)
    man = ckpt / MANIFEST
    if not man.is_file():
        return None
    try:
        files = json.loads(man.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError):
        return f"{MANIFEST} is unreadable"
    for name, meta in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != meta["size"]:
            return f"{name} has {size} bytes, {meta['size']} were saved"
        if sha256_file(f) != meta["sha256"]:
            return f"{name} does not match its saved SHA-256"
    return None


def newest_intact_checkpoint(run_dir: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint that matches its manifest (None when the run has none).

    Damaged newer ones are renamed ``step-N.damaged`` (:func:`set_aside`) and
    named through ``warn`` (default: one line on stderr); when every
    checkpoint is damaged this raises a one-line MemlabError and moves nothing.
    """
    dirs = checkpoint_dirs(run_dir)
    damaged: list[tuple[Path, str]] = []
    say = warn or _warn
    for d in reversed(dirs):
        problem = verify_checkpoint(d)
        if problem is None:
            if damaged:
                what = "; ".join(f"{p.name} ({why})" for p, why in damaged)
                say(f"{run_dir}: checkpoint {what}: damaged ({set_aside(run_dir, [p for p, _ in damaged])}); "
                    f"using {d.name}, the newest intact one")
            if not (d / MANIFEST).is_file():
                _warn(f"checkpoint {d} has no {MANIFEST} (saved before manifests): its files are not checked")
            return d
        damaged.append((d, problem))
    if damaged:
        raise MemlabError(f"no intact checkpoint in {run_dir}: {'; '.join(f'{p.name} ({why})' for p, why in damaged)}")
    return None


def set_aside(run_dir: Path, dirs: list[Path]) -> str:
    """Rename damaged checkpoints ``dirs`` to ``step-N.damaged`` (kept) unless another process holds the run;
    returns what was done, as a phrase."""
    from memlab.rundir import claim, holds

    held = holds(run_dir)
    try:
        lock = held or claim(run_dir, fresh=False)
    except MemlabError as e:
        return f"left in place: {str(e).split(' (')[0]}"
    moved = []
    try:
        for d in dirs:
            target, n = d.with_name(d.name + DAMAGED), 1
            while target.exists():
                target, n = d.with_name(f"{d.name}{DAMAGED}{n}"), n + 1
            os.replace(d, target)
            moved.append(target.name)
    except OSError as e:
        return f"left in place: cannot rename it ({e.strerror})"
    finally:
        if held is None:
            lock.release()
    return f"set aside as {', '.join(moved)}"


def _warn(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        print(f"memlab: warning: {msg}", file=sys.stderr)


def weights_are_finite(model) -> bool:
    """Whether every parameter and buffer of ``model`` is finite (one device sync)."""
    flags = [torch.isfinite(t).all() for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    return bool(torch.stack(flags).all().item()) if flags else True


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    tokenizer=None,
    keep: int = 2,
    rank_rng: list[dict[str, Any]] | None = None,
    scaler=None,
) -> Path:
    """Write a checkpoint atomically (temp folder, manifest last, then rename) and prune old ones (``keep=0`` keeps all).

    Refuses (:class:`NonFiniteWeights`) a model with NaN or infinite weights;
    a failed write (a full disk) removes the partial folder and raises one
    line that names the checkpoint the run still has.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"{CKPT_PREFIX}{step:08d}"
    if not weights_are_finite(model):
        good = newest_intact_checkpoint(run_dir, warn=lambda m: None)
        raise NonFiniteWeights(f"the weights at step {step} are not finite (NaN or inf) and were not saved; last good "
                               f"checkpoint: {good or 'none'}; lower train.lr or check the data")
    tmp = root / f"{final.name}.tmp{os.getpid()}"
    from memlab.rundir import guarded, replace_synced

    kept = lambda why: still_kept(run_dir, why)  # noqa: E731
    with guarded(f"checkpoint {final.name}", tmp, then=kept):
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        with guarded(f"checkpoint {final.name}", tmp, then=kept, name_in=(tmp, final)):  # names the file that failed
            model.save_pretrained(str(tmp), safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        for rank, st in enumerate(rank_rng or [rng_state()]):
            torch.save(st, tmp / f"rng-{rank}.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(dict(trainer_state, step=step)))
        write_manifest(tmp)
    old = None
    if final.exists():  # re-saving the same step: move the old copy aside, never leave no checkpoint
        old = root / f"{final.name}.old{os.getpid()}"
        os.replace(final, old)
    replace_synced(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def check_room_for_checkpoint(run_dir: Path, model, start: Path | None) -> None:
    """Refuse, before any training step, a run folder that cannot take the run's next checkpoint: read-only
    (the run folder or its ``checkpoints/``), a file size limit below its largest file, or a disk with less free
    space than one checkpoint. Sizes: the files of ``start`` (the checkpoint a resume continues from), else the
    weights and AdamW's two fp32 moments per trained parameter."""
    if start is not None:
        sizes = [p.stat().st_size for p in Path(start).rglob("*") if p.is_file()]
    else:
        sizes = [sum(p.numel() * p.element_size() for p in model.parameters()),
                 2 * 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)]
    root = Path(run_dir) / "checkpoints"
    check_room([Path(run_dir)] + ([root] if root.is_dir() else []), max(sizes), sum(sizes), "a checkpoint")


def remedy(run_dir: Path, reason: str | None) -> str:
    """What to do about a storage failure of ``reason`` (:func:`memlab.rundir.storage_failure`'s phrase)."""
    if reason == "the disk is full":
        return "free some space"
    if reason == "a file size limit was reached":
        return "raise the file size limit (ulimit -f)"
    if reason and ("read-only" in reason.lower() or "permission" in reason.lower()
                   or "not permitted" in reason.lower()):
        return f"make {run_dir} writable"
    return "fix the cause"


def still_kept(run_dir: Path, reason: str | None = None) -> str:
    """What a run whose write failed still holds, and how to go on (the tail of a failed write's line)."""
    try:
        good = newest_intact_checkpoint(run_dir, warn=lambda m: None)
    except MemlabError:
        good = None
    return (f"the run keeps checkpoint {good.name}; {remedy(run_dir, reason)}, then continue it with "
            f"`memlab train --resume {run_dir}`") if good else "the run has no checkpoint yet"


def save_failure(run_dir: Path, what: str, e: BaseException) -> str:
    """One line for a failed write: why, what the run folder still holds, how to go on."""
    from memlab.rundir import storage_failure

    reason = storage_failure(e) or " ".join(str(e).split())[:120]
    return f"could not write {what} ({reason}); {still_kept(run_dir, reason)}"


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temporary folders that a killed save left behind (``.tmpPID``, ``.oldPID``; never damaged ones)."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(CKPT_PREFIX) and (".tmp" in p.name or ".old" in p.name):
                shutil.rmtree(p, ignore_errors=True)


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    f = Path(ckpt) / "trainer_state.json"
    try:
        state = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{f} is damaged ({type(e).__name__}); resume from an older checkpoint") from None
    if not isinstance(state, dict) or "step" not in state:
        raise ModelError(f"{f} is damaged (no step); resume from an older checkpoint")
    return state


def load_model_weights(model, ckpt: Path) -> None:
    """Load ``model.safetensors`` (or sharded safetensors) from a checkpoint into ``model`` (strict)."""
    from safetensors.torch import load_file

    files = sorted(Path(ckpt).glob("model*.safetensors"))
    if not files:
        raise ModelError(f"{ckpt}: no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # SafetensorError (truncated or corrupt header), OSError
            raise ModelError(f"{f} is damaged ({' '.join(str(e).split())[:120]})") from None
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise ModelError(f"checkpoint {ckpt} does not fit the model: {str(e).splitlines()[-1].strip()[:200]}") from None
    # tied weights are saved once; anything else missing is an error
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not any(k.endswith(t) for t in tied)]
    check_weights_fit(f"checkpoint {ckpt}", type(model).__name__, missing, unexpected)
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def check_weights_fit(what: str, model_name: str, missing, unexpected, mismatched=()) -> None:
    """One ModelError naming the first missing, unexpected and mismatched keys, when there are any."""
    missing, unexpected, mismatched = sorted(missing), sorted(unexpected), [str(m) for m in mismatched]
    if not (missing or unexpected or mismatched):
        return
    parts = [f"{len(v)} {name} (first: {', '.join(map(str, v[:2]))})"
             for name, v in (("missing", missing), ("unexpected", unexpected), ("of another shape", mismatched)) if v]
    raise ModelError(f"{what}: the saved weights do not fit {model_name}: keys {'; '.join(parts)}")


def load_torch(path: Path) -> Any:
    """``torch.load`` (weights only) of a checkpoint file; a damaged file is one ModelError line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{path} is missing") from None
    except Exception as e:  # a truncated zip archive, an unpickling error
        raise ModelError(f"{path} is damaged ({' '.join(str(e).split())[:120]})") from None
