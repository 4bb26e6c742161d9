"""Checkpoints: ``save_pretrained`` weights (safetensors) plus trainer state,
written to a temporary folder and renamed, so a killed run never leaves a
half-written checkpoint behind.

Layout of ``RUN/checkpoints/step-00000100/``::

    config.json, model.safetensors     the model (save_pretrained)
    tokenizer files                    when the recipe has a tokenizer
    optimizer.pt, scheduler.pt         torch.save'd state dicts (loaded with weights_only=True)
    rng-RANK.pt                        torch RNG state of each process
    trainer_state.json                 step, data position, python/numpy RNG, callback state
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
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def set_rng_state(state: dict[str, Any]) -> None:
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
    rank_rng: dict[int, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint atomically (temp folder, then rename) and prune old ones."""
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
    for rank, st in (rank_rng or {0: torch.get_rng_state()}).items():
        torch.save(st, tmp / f"rng-{rank}.pt")
    state = dict(trainer_state, step=step, rng=rng_state())
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    if final.exists():  # re-saving the same step (e.g. the final save after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "trainer_state.json").read_text())


def load_model_weights(model, ckpt: Path) -> None:
    """Load ``model.safetensors`` (or sharded safetensors) from a checkpoint into ``model`` (strict)."""
    from safetensors.torch import load_file

    files = sorted(Path(ckpt).glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{ckpt}: no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied weights are saved once; anything else missing is an error
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not any(k.endswith(t) for t in tied)]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def load_torch(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
