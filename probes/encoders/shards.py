"""The probe on N processes: ``memlab launch --multi_cpu --num_processes N probe ...`` (gloo on CPUs) or
``--multi_gpu`` (NCCL, one device a process).

What each process does:

1. :func:`start`: joins the launch's process group (accelerate's ``PartialState``, as training does), takes its own
   device (``cuda:LOCAL_RANK`` on GPUs) and, with ``threads`` unset, its share of the host's cores;
2. loads the encoder and cuts the same chunks (every process reads the same text);
3. :func:`cached_sharded`: encodes its share of the chunks (rows ``rank::N``), and the shares are gathered in chunk
   order into one ``(N, D)`` tensor on every process; with ``cache_dir`` the main process writes it as the one
   cache (:mod:`memlab.data.mmapcache`) and every process reads that file (mapped), so a later run of any layout
   reads it; a finished cache is read, not encoded;
4. the main process fits the decoders, reads out, scores and writes the one report (its ``timing["processes"]``
   names the processes and their devices); the others end when their share of the encoder pass is in.

The fit is the one-process fit on the gathered embeddings, so two processes read what one reads (to the last bit
where the encoder's numbers do not depend on how its batches are made up; within float noise otherwise). Sweeps
(layers, lengths, learning curves, comparisons) run in one process.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from accelerate import PartialState

from memlab.data.mmapcache import PieceCache, cached_embeddings, chunks_fingerprint
from memlab.devices import launched, resolve_device
from memlab.errors import ConfigError
from memlab.probes.options import seq_lens, train_sizes
from memlab.train.processes import SetupEnv


def is_main() -> bool:
    return int(os.environ.get("RANK", "0") or 0) == 0


def check_launch(opts) -> None:
    """A launch of several processes runs one probe: a sweep is refused before any compute (one line)."""
    if not launched():
        return
    if opts.layers is not None or opts.compare is not None or len(train_sizes(opts)) > 1 or len(seq_lens(opts)) > 1:
        e = ConfigError("a launch of several processes runs one probe: layer sweeps, comparisons, learning curves and "
                        "length sweeps run in one process (memlab probe without memlab launch)")
        e.quiet = not is_main()  # every process finds it: the main one prints it
        raise e


def start(opts):
    """Join the launch (None outside one): ``(SetupEnv, opts on this process's device)``."""
    if not launched():
        return None, opts
    state = PartialState(cpu=resolve_device(opts.device).type == "cpu")
    env = SetupEnv.from_state(state)
    if opts.threads is None and env.device.type == "cpu":  # N processes share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.num_processes))
    if env.device.type != "cpu" and opts.device_map is None:
        opts = replace(opts, device=str(env.device))
    return env, opts


def encode_sharded(env, encode, ids: torch.Tensor) -> torch.Tensor:
    """Every process encodes rows ``rank::N`` of ``ids (N, T)`` with ``encode`` ((b, T) -> (b, D)); the shares,
    gathered, are ``(N, D)`` in chunk order on every process."""
    rank, world = env.process_index, env.num_processes
    mine = ids[rank::world]  # (n_r, T)
    part = encode(mine).cpu() if mine.shape[0] else None  # (n_r, D)
    parts = env.gather(part)
    first = next(p for p in parts if p is not None)
    z = torch.empty(ids.shape[0], first.shape[1], dtype=first.dtype)  # (N, D)
    for r, p in enumerate(parts):
        if p is not None:
            z[r::world] = p
    return z


def cached_sharded(env, stem, ids: torch.Tensor, encode, dtype: str = "float32") -> tuple[torch.Tensor, bool]:
    """``encode`` ((b, T) -> (b, D)) of chunks ``ids (N, T)`` across the processes of ``env``, cached as ``stem``
    (None: not cached; :mod:`memlab.data.mmapcache`): ``(z (N, D), whether it was read from the cache)``. A
    finished cache is read by every process; else each encodes its share, the main process writes the gathered
    rows and every process then reads that one file."""
    if stem is None:
        return encode_sharded(env, encode, ids), False
    n = int(ids.shape[0])
    finished = env.broadcast(PieceCache(stem, dtype).finished(chunks_fingerprint(ids), n)[0] is not None
                             if env.is_main else None)
    if not finished:
        z = encode_sharded(env, encode, ids)  # (N, D)
        if env.is_main:
            cached_embeddings(stem, ids, None, dtype, rows_of=lambda lo, hi: z[lo:hi], width=int(z.shape[1]))
        env.barrier()  # the main process has written it
    got, _ = cached_embeddings(stem, ids, None, dtype)  # every process reads the one file
    return got, bool(finished)


def describe(env) -> dict:
    """What the report says of the launch: how many processes, each one's device, who did what."""
    devices = env.gather(str(env.device))
    return {"count": env.num_processes, "devices": devices, "encoder_pass": "sharded across the processes",
            "fit": "the main process, on the gathered embeddings"}
