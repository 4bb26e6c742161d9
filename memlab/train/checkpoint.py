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
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CKPT_PREFIX = "step-"


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX) and "." not in p.name
             and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CKPT_PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


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
    """Write a checkpoint atomically (temp folder, then rename) and prune old ones (``keep=0`` keeps all)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{CKPT_PREFIX}{step:08d}"
    tmp = root / f"{final.name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
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
    old = None
    if final.exists():  # re-saving the same step: move the old copy aside, never leave no checkpoint
        old = root / f"{final.name}.old{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temporary folders that a killed save left behind."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith(CKPT_PREFIX) and ("." in p.name):
                shutil.rmtree(p, ignore_errors=True)


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "trainer_state.json").read_text())


def load_model_weights(model, ckpt: Path) -> None:
    """Load ``model.safetensors`` (or sharded safetensors) from a checkpoint into ``model`` (strict)."""
    from safetensors.torch import load_file

    from memlab.errors import ModelError

    files = sorted(Path(ckpt).glob("model*.safetensors"))
    if not files:
        raise ModelError(f"{ckpt}: no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise ModelError(f"checkpoint {ckpt} does not fit the model: {str(e).splitlines()[-1].strip()[:200]}") from None
    # tied weights are saved once; anything else missing is an error
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not any(k.endswith(t) for t in tied)]
    if missing or unexpected:
        raise ModelError(f"checkpoint {ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def load_torch(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
