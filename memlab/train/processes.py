"""Devices and processes: what a recipe's set-up runs on, and how the training engine is chosen.

:class:`SetupEnv` is handed to ``recipe.setup(cfg, run_dir, env=...)``: the
accelerator's device (so frozen encoders and spaces run there, not on the CPU,
before any cache is built), the launch's processes, and the few collectives a
set-up needs to do its precompute once (main process first, or sharded by rank
and merged) so that every rank reads the same result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from memlab import devices
from memlab.devices import best_device
from memlab.errors import MemlabError


def use_cpu(cfg) -> bool:
    """CPU when asked, or when no accelerator is present (so that `accelerate launch --multi_gpu
    --num_processes N` on a CPU machine runs N gloo processes)."""
    return bool(cfg.cpu) or best_device().type == "cpu"


def mixed_precision(choice: str, cpu: bool) -> str:
    """``auto``: bf16 on an accelerator that multiplies it natively, else none; other choices as given
    (:func:`memlab.devices.mixed_precision`, which decides)."""
    return devices.mixed_precision(choice, torch.device("cpu") if cpu else best_device())


def enable_tf32() -> None:
    """TF32 matrix multiplies and convolutions for float32 on CUDA (Ampere on; a no-op elsewhere)."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32"
        conv.fp32_precision = "tf32"
    else:  # pragma: no cover - older torch
        matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def check_batch_split(cfg, world: int) -> None:
    """The global batch must share out evenly over processes and accumulation steps (checked before any compute)."""
    if cfg.batch_size % (world * cfg.grad_accum):
        hint = f"; with {world} processes use a multiple of {world * cfg.grad_accum}" if world > 1 else ""
        raise MemlabError(f"train.batch_size={cfg.batch_size} must be divisible by processes ({world}) x grad_accum "
                          f"({cfg.grad_accum}){hint}")


SUPPORTED_ENGINES = ("NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_MLU", "MULTI_NPU", "MULTI_MUSA", "MULTI_HPU",
                     "MULTI_SDAA")
"""accelerate distributed types memlab trains under: one process, or data-parallel (DDP) replicas."""

ENGINE_FLAGS = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
                "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM", "ACCELERATE_USE_TP": "tensor parallelism"}
"""What ``accelerate launch`` sets for the sharded engines (read before the process group starts: a DeepSpeed
launch would otherwise fail in accelerate's own set-up with an unrelated message)."""


def launch_rank() -> int:
    """This process's rank from the launcher's environment (0 outside a launch)."""
    return int(os.environ.get("RANK", "0") or 0)


def check_engine(state=None) -> None:
    """Refuse, before any compute, a launch whose engine memlab does not support (sharded or offloaded:
    FSDP, DeepSpeed, Megatron-LM): checkpoints assume a full replica of the model on every process (DDP).
    Without ``state``, from the launcher's environment; with it, from accelerate's distributed type."""
    asked = [name for flag, name in ENGINE_FLAGS.items() if os.environ.get(flag, "false").lower() in ("true", "1")]
    kind = getattr(getattr(state, "distributed_type", None), "name", None) if state is not None else None
    if asked or (kind is not None and kind not in SUPPORTED_ENGINES):
        e = MemlabError(f"the launch asks for {asked[0] if asked else kind}, which memlab does not support (its "
                        "checkpoints hold full replicas); launch with `accelerate launch --multi_gpu` (data "
                        "parallel) or one process")
        e.quiet = launch_rank() != 0  # every process finds it: the main one prints it
        if e.quiet:  # and prints it before the launcher, seeing this process end, stops the main one
            import time

            time.sleep(5)
        raise e


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask: a container's or ``taskset``'s share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


def rank_threads(asked: int, processes_here: int, cores: int | None = None, environ=None) -> int | None:
    """Intra-op threads for one of ``processes_here`` processes on a CPU host, or None to keep torch's own.

    ``asked`` (``train.threads``) > 0 wins. Otherwise, with several processes on the host, each takes
    ``cores // processes_here`` (at least 1), unless the user set ``OMP_NUM_THREADS`` to more than 1:
    ``torchrun`` and ``accelerate launch`` both put ``OMP_NUM_THREADS=1`` into every process when it is
    unset, which would leave all but N of the host's cores idle. (Pin one thread a process with
    ``train.threads=1``.) One process keeps torch's default (``OMP_NUM_THREADS`` or every core)."""
    env = os.environ if environ is None else environ
    if asked > 0:
        return asked
    if processes_here <= 1:
        return None
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp not in ("", "1"):
        return None  # torch already reads it
    return max(1, (cores if cores is not None else available_cores()) // processes_here)


def set_rank_threads(cfg, state) -> int:
    """Apply :func:`rank_threads` on a CPU process of ``state`` (GPU processes keep torch's default); returns
    the threads this process now uses."""
    if state.device.type == "cpu":
        here = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes) or state.num_processes)
        n = rank_threads(cfg.threads, here)
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass
class SetupEnv:
    """Where a recipe's set-up runs. Default: one process on the CPU (a set-up called outside a run)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    process_index: int = 0
    num_processes: int = 1
    state: Any = None
    """accelerate's ``PartialState`` of the launch (None: one process)."""

    @classmethod
    def from_state(cls, state) -> "SetupEnv":
        return cls(device=state.device, process_index=state.process_index, num_processes=state.num_processes,
                   state=state)

    @property
    def is_main(self) -> bool:
        return self.process_index == 0

    def frozen_autocast(self):
        """Context for frozen-model precompute: bf16 matrix multiplies on an accelerator that does them natively
        (:func:`memlab.devices.frozen_autocast`, which decides)."""
        return devices.frozen_autocast(self.device)

    def barrier(self) -> None:
        if self.num_processes > 1:
            self.state.wait_for_everyone()

    def broadcast(self, obj: Any) -> Any:
        """The main process's ``obj`` on every process."""
        if self.num_processes == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def gather(self, obj: Any) -> list:
        """Every process's ``obj``, in process order, on every process."""
        if self.num_processes == 1:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` computed on the main process alone, its result on every process."""
        return self.broadcast(fn() if self.is_main else None)
