"""The control cache on disk: a trained control run kept under ``cache_dir`` and reused by later probes.

A control run depends on the token data, the vocabulary and the decoder's options only
(:func:`memlab.probes.run.control_key` hashes them), not on the encoder, so a probe of any model on the same chunks
with the same decoder options reads the same control. :class:`ControlCache` has the interface of the in-memory dict
that :func:`memlab.probes.decoder.fit.fit_decoders` reads and fills (``key in cache``, ``cache[key]``,
``cache[key] = entry``; an entry is a :class:`~memlab.probes.decoder.records.ControlEntry`) and keeps every entry it is given on disk as well::

    CACHE_DIR/controls/<key>-<side>/     side: the compute side (:func:`compute_side`), e.g. cpu-bf16-members
        control.safetensors   the control's weights (its second run)
        start.safetensors     the first run's weights (the decoder the contained probe starts from)
        entry.json            metrics, histories, owner, each decoder's embedding width

An entry folder is written under a temporary name and renamed when whole. ``entry.json`` records the digest of each
weights file (of its bytes and of the entry's key: :mod:`memlab.cachecheck`) and is sealed with a digest of its own
content; both are checked before an entry is read. One that is partial, damaged (bytes changed, numbers edited) or
of another key is named in one warning line and ignored (the control is then trained again and the entry replaced);
a folder that cannot be written is one warning line too, and the run goes on with the control in memory. Nothing
is pickled: weights are safetensors, everything else JSON (per-chunk arrays as tagged lists, floats exactly).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from memlab.cachecheck import file_digest, file_matches, seal, sealed
from memlab.devices import auto_dtype, batched_groups
from memlab.errors import is_read_error
from memlab.probes.readings import ChunkScores, DecoderScores
from memlab.probes.decoder.records import ControlEntry

FORMAT = "memlab-probe-control-2"
"""The entry layout's name (version 2: each decoder's scores as metrics, per-chunk numbers and reconstructions)."""
FOLDER = "controls"
"""Subfolder of ``cache_dir`` holding the control entries (beside the embedding caches)."""
DECODERS = ("control", "start")
"""The entry's decoders (their fields of :class:`~memlab.probes.decoder.records.ControlEntry`)."""


def encode(x: Any) -> Any:
    """``x`` as JSON: numpy arrays and tuples tagged, numpy scalars as Python numbers, dicts with non-string keys as
    item lists; :func:`decode` gives ``x`` back (floats exactly: JSON writes a float's shortest exact repr)."""
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype), "shape": list(x.shape)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v) for v in x]}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x):
            return {k: encode(v) for k, v in x.items()}
        return {"__items__": [[encode(k), encode(v)] for k, v in x.items()]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot keep a {type(x).__name__} in a control entry")


def decode(x: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(x, list):
        return [decode(v) for v in x]
    if isinstance(x, dict):
        if "__ndarray__" in x:
            return np.array(x["__ndarray__"], dtype=x["dtype"]).reshape(x["shape"])
        if "__tuple__" in x:
            return tuple(decode(v) for v in x["__tuple__"])
        if "__items__" in x:
            return {decode(k): decode(v) for k, v in x["__items__"]}
        return {k: decode(v) for k, v in x.items()}
    return x


def _scores_as_json(scores: DecoderScores | None) -> dict | None:
    """A decoder's scores as :func:`encode` keeps them (None: not scored)."""
    if scores is None:
        return None
    chunks = None if scores.chunks is None else vars(scores.chunks)
    return {"metrics": scores.metrics, "chunks": chunks, "reconstruction": scores.reconstruction}


def _scores_of(x: dict | None) -> DecoderScores | None:
    """The inverse of :func:`_scores_as_json` (after :func:`decode`)."""
    if x is None:
        return None
    chunks = None if x["chunks"] is None else ChunkScores(**x["chunks"])
    return DecoderScores(x["metrics"], chunks, x["reconstruction"])


def compute_side(device: torch.device | str) -> str:
    """The hardware-dependent choices a control's training depends on (:mod:`memlab.devices`): the device kind,
    the decoders' compute dtype and whether a group runs as one batched pass. A control trained on another side
    reads differently in the last digits, so each side keeps its own entry."""
    dev = torch.device(device)
    dtype = "bf16" if auto_dtype(dev) == torch.bfloat16 else "fp32"
    return f"{dev.type}-{dtype}-{'batched' if batched_groups(dev) else 'members'}"


def _weights(decoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The decoder's state as separate host tensors (tied weights are saved once per name)."""
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in decoder.state_dict().items()}


class ControlCache:
    """Control runs kept in memory (``memory``: a dict shared with other probes, or a new one) and under
    ``cache_dir/controls``.

    ``build(embed_dim)``: a fresh decoder of these decoder options for an embedding of that width; a cached entry's
    weights are loaded into it (its own standardisation included). ``side``: :func:`compute_side` of the device the
    decoders train on (part of each entry's folder name)."""

    def __init__(self, cache_dir: str | Path, build: Callable[[int], torch.nn.Module], memory: dict | None = None,
                 side: str = ""):
        self.folder = Path(cache_dir) / FOLDER
        self.build = build
        self.side = side
        self.memory = memory if memory is not None else {}
        self.loaded: set[str] = set()
        """Keys read from disk by this object (not trained in this process)."""
        self.missed: set[str] = set()
        """Keys looked for on disk and not found whole (not looked for again until written)."""

    def entry_path(self, key: str) -> Path:
        return self.folder / (f"{key}-{self.side}" if self.side else key)

    def __contains__(self, key: str) -> bool:
        if key in self.memory:
            return True
        if key in self.missed:
            return False
        entry = self._read(key)
        if entry is None:
            self.missed.add(key)
            return False
        self.memory[key] = entry
        self.loaded.add(key)
        return True

    def __getitem__(self, key: str):
        if key not in self:
            raise KeyError(key)
        return self.memory[key]

    def __setitem__(self, key: str, entry: ControlEntry) -> None:
        self.memory[key] = entry
        self.missed.discard(key)
        self._write(key, entry)

    def __len__(self) -> int:
        tail = f"-{self.side}" if self.side else ""
        names = [p.name for p in self.folder.iterdir() if (p / "entry.json").is_file()] if self.folder.is_dir() else []
        return len({n[: len(n) - len(tail)] for n in names if n.endswith(tail)} | set(self.memory))

    def _read(self, key: str) -> ControlEntry | None:
        """The entry kept under ``key``, or None: absent, or damaged (named in one warning line)."""
        where = self.entry_path(key)
        if not where.is_dir():
            return None
        try:
            info = json.loads((where / "entry.json").read_text())
            if info.get("format") != FORMAT and str(info.get("format", "")).startswith("memlab-probe-control"):
                print(f"memlab: note: control cache {where} was written in another layout ({info['format']}, this "
                      f"memlab reads {FORMAT}); training the control again", file=sys.stderr)
                return None
            if info.get("format") != FORMAT or info.get("key") != where.name:
                raise ValueError("not a control entry of this key")
            if "digest" not in info:
                raise ValueError("it records no digest (written by an earlier memlab)")
            if not sealed(info):
                raise ValueError("entry.json does not match its digest")
            for name in DECODERS:
                if not file_matches(where / f"{name}.safetensors", (info.get("files") or {}).get(name),
                                    {"format": FORMAT, "key": where.name, "file": name}):
                    raise ValueError(f"{name}.safetensors does not match its digest")
            decs = []
            for name in DECODERS:
                dec = self.build(int(info["embed_dim"][name]))
                missing, unexpected = dec.load_state_dict(load_file(str(where / f"{name}.safetensors")), strict=False)
                if missing or unexpected:
                    raise ValueError(f"{name}.safetensors does not fit the decoder (missing {sorted(missing)[:3]}, "
                                     f"unexpected {sorted(unexpected)[:3]})")
                dec.eval()
                decs.append(dec)
            parts = decode(info["entry"])
            metrics, history, owner, metrics_1, history_1 = (parts[k] for k in
                                                             ("metrics", "history", "owner", "metrics_1", "history_1"))
            metrics, metrics_1 = _scores_of(metrics), _scores_of(metrics_1)
        except Exception as e:  # a partial or damaged entry: SafetensorError, OSError, JSON or shape errors
            if not (is_read_error(e) or isinstance(e, (KeyError, TypeError, RuntimeError))):
                raise
            print(f"memlab: warning: control cache {where} is damaged ({' '.join(str(e).split())[:120]}); "
                  "training the control again", file=sys.stderr)
            return None
        return ControlEntry(metrics, history, owner, decs[0], decs[1], metrics_1, history_1)

    def _write(self, key: str, entry: ControlEntry) -> None:
        """``entry`` under ``key``: written in a temporary folder, renamed when whole (replacing an older one)."""
        control, start = entry.control, entry.start
        final = self.entry_path(key)
        tmp = self.folder / f".{final.name}.tmp-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            files = {}
            for name, dec in zip(DECODERS, (control, start)):
                save_file(_weights(dec), str(tmp / f"{name}.safetensors"))
                files[name] = file_digest(tmp / f"{name}.safetensors", {"format": FORMAT, "key": final.name,
                                                                        "file": name})
            info = {"format": FORMAT, "key": final.name, "files": files,
                    "embed_dim": {n: int(d.config.embed_dim) for n, d in zip(DECODERS, (control, start))},
                    "entry": encode({"metrics": _scores_as_json(entry.scores), "history": entry.history,
                                     "owner": entry.owner, "metrics_1": _scores_as_json(entry.first_scores),
                                     "history_1": entry.first_history})}
            (tmp / "entry.json").write_text(json.dumps(seal(info)))
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except (OSError, TypeError, ValueError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if (final / "entry.json").is_file() and isinstance(e, OSError) and self._read(key) is not None:
                return  # another process kept the same control first
            print(f"memlab: warning: could not keep the control in {final} ({' '.join(str(e).split())[:120]}); "
                  "it is used from memory", file=sys.stderr)
