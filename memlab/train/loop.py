"""The training loop, on accelerate.

One loop for every family: device placement, mixed precision where the
hardware has it, gradient accumulation, clipping, AdamW, warmup + cosine,
periodic evaluation, ``metrics.jsonl`` / ``summary.json``, a progress bar,
atomic checkpoints, and exact resume.

Data order is a seeded permutation per epoch; a global batch is a slice of
it, shared out over processes (``rank::world``) and then over accumulation
steps. The data position (epoch, batch) is checkpointed, so a resumed run
sees exactly the batches that an uninterrupted run would have seen.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from memlab import interrupts, randomness
from memlab.devices import fused_adamw, uses_tf32
from memlab.errors import MemlabError
from memlab.progress import progress_bar
from memlab.train import checkpoint as ckpt
from memlab.flops import measure_matmul_flops, model_flops_utilization  # noqa: F401  (re-exported)
from memlab.train.processes import check_batch_split, enable_tf32, mixed_precision, use_cpu  # noqa: F401
from memlab.train.metrics_log import MetricWindow, UniformWatch, read_groups
from memlab.train.schedule import warmup_cosine
from memlab.train.setup import StepOutput, TrainSetup


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device | None = None) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on biases, norms or 1-D parameters); the fused kernel where
    :func:`memlab.devices.fused_adamw` says (parameters move there in accelerate's prepare)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    params = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused_adamw(device) or None)


def lr_lambda(cfg):
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``max_steps``."""
    return lambda step: warmup_cosine(step, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)


class Trainer:
    """Runs a :class:`TrainSetup` under an experiment's ``train`` config into a run directory.

    ``tracker`` (:class:`memlab.tracking.Tracker`, optional) receives every
    record that goes to ``metrics.jsonl``.
    """

    def __init__(self, setup: TrainSetup, cfg, run_dir: Path, tracker=None):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedDataParallelKwargs

        self.setup, self.cfg, self.run_dir = setup, cfg, Path(run_dir)
        self.tracker = tracker
        cpu = use_cpu(cfg)
        # parameters that a step may leave unused by design (a curriculum's phases use different parts): DDP
        # then looks for them after every forward instead of waiting for their gradients
        ddp = DistributedDataParallelKwargs(find_unused_parameters=bool(setup.unused_parameters))
        # accelerate keeps one mixed precision per process: a run after another in the same process (memlab's main()
        # called again, a notebook) starts from a fresh accelerator state; the process group (PartialState) stays
        AcceleratorState._reset_state(reset_partial_state=False)
        self.acc = Accelerator(cpu=cpu, mixed_precision=mixed_precision(cfg.mixed_precision, cpu), kwargs_handlers=[ddp])
        if uses_tf32(self.acc.device):
            enable_tf32()
        world = self.acc.num_processes
        check_batch_split(cfg, world)
        self.micro = cfg.batch_size // (world * cfg.grad_accum)
        n = len(setup.train_data)
        if n < cfg.batch_size:
            raise MemlabError(f"the training data has {n} examples, fewer than one batch of {cfg.batch_size}")
        self.batches_per_epoch = n // cfg.batch_size
        self.optimizer = make_optimizer(setup.model, cfg, self.acc.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.model, self.optimizer = self.acc.prepare(setup.model, self.optimizer)
        if cfg.compile:
            # in place: the module and its state-dict keys stay as they are
            self.model.compile(dynamic=True, backend=cfg.compile_backend)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.on_checkpoint: list = []  # called with each checkpoint saved (main process), e.g. a resume's new config
        self.metrics_mark: int | None = None  # metrics.jsonl's size at the last checkpoint (mark_metrics)
        self.best_eval: float | None = None
        self.last_eval: dict[str, float] = {}
        self._permutation: tuple[int, list[int]] | None = None
        self.window = MetricWindow(self.acc)
        vocab = getattr(getattr(setup.model, "config", None), "vocab_size", None)
        self.uniform = UniformWatch(vocab if isinstance(vocab, int) else None, cfg.warmup_steps)

    # ------------------------------------------------------------------ data
    def _collate(self, items: list) -> dict:
        if self.setup.collate_fn is not None:
            return self.setup.collate_fn(items)
        return {k: torch.stack([it[k] for it in items]) for k in items[0]}

    def _to_device(self, items: list) -> dict:
        return {k: (v.to(self.acc.device) if torch.is_tensor(v) else v) for k, v in self._collate(items).items()}

    def _global_batch_indices(self) -> list[int]:
        if self._permutation is None or self._permutation[0] != self.epoch:  # one permutation per epoch
            g = torch.Generator().manual_seed(self.cfg.seed * 100003 + self.epoch)
            self._permutation = (self.epoch, torch.randperm(len(self.setup.train_data), generator=g).tolist())
        b = self.batch_in_epoch
        return self._permutation[1][b * self.cfg.batch_size : (b + 1) * self.cfg.batch_size]

    def _batch(self, data, idx: list[int], seed: int) -> dict:
        """The collated examples ``idx`` of ``data`` on the device, with their per-example seeds
        (:mod:`memlab.randomness`: the loss's random draws do not depend on how the batch is split)."""
        batch = self._to_device([data[i] for i in idx])
        batch[randomness.SEED_KEY] = randomness.example_seeds(seed, self.step, torch.tensor(idx)).to(self.acc.device)
        return batch

    def _micro_batches(self) -> list[dict]:
        idx = self._global_batch_indices()[self.acc.process_index :: self.acc.num_processes]  # this process's share
        return [self._batch(self.setup.train_data, idx[a * self.micro : (a + 1) * self.micro], self.cfg.seed)
                for a in range(self.cfg.grad_accum)]

    def _advance_data(self) -> None:
        self.batch_in_epoch += 1
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0

    def eval_batches(self) -> Iterator[dict]:
        data = self.setup.eval_data
        if data is None:
            return
        size, world = self.micro, self.acc.num_processes
        n = min(len(data), self.cfg.eval_batches * size * world)
        # every process gets the same number of examples (wrapping around a tiny eval set), so none is idle
        n = -(-n // world) * world
        idx = [i % len(data) for i in range(n)][self.acc.process_index :: world]
        for s in range(0, len(idx), size):
            yield self._batch(data, idx[s : s + size], self.cfg.seed + 1)

    # ------------------------------------------------------------------ logging
    def _log(self, record: dict[str, Any]) -> None:
        for cb in self.setup.callbacks:
            record.update(cb.log_fields())
        if self.acc.is_main_process:
            try:
                with open(self.metrics_path, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
            except OSError as e:
                raise MemlabError(ckpt.save_failure(self.run_dir, f"{self.metrics_path.name} at step {self.step}", e)) from None
            if self.tracker is not None:
                self.tracker.log(record, step=record["step"])

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss metrics over the evaluation batches (the recipe's ``eval_step_fn`` when it gives one, else
        ``loss_fn``), plus the recipe's ``eval_fn`` on the same batches (collated again only for it)."""
        if self.setup.eval_data is None:
            return {}
        model = self.model
        model.eval()
        step_fn = self.setup.eval_step_fn
        windows: dict[str, MetricWindow] = {}
        for batch in self.eval_batches():  # streamed: one evaluation batch on the device at a time
            with self.acc.autocast():
                groups = (step_fn(model, batch) if step_fn is not None
                          else {"loss": self.setup.loss_fn(model, batch)})
            for name, out in groups.items():
                windows.setdefault(name, MetricWindow(self.acc)).add(out, self.step)
        if windows and "loss" not in windows:
            raise MemlabError("the recipe's eval_step_fn gave no 'loss' group")
        metrics = read_groups(windows)
        if self.setup.eval_fn is not None:
            metrics.update(self.setup.eval_fn(model, self.eval_batches()))
        model.train()
        return metrics

    def _run_eval(self) -> None:
        metrics = self.evaluate()
        if not metrics:
            return
        extra: dict[str, Any] = {}
        for cb in self.setup.callbacks:
            extra.update(cb.on_eval(self.step, metrics) or {})
        self.last_eval = metrics
        if self.best_eval is None or metrics["loss"] < self.best_eval:
            self.best_eval = metrics["loss"]
        self._log({"step": self.step, "split": "eval", **metrics, **extra})

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path | None:
        self.acc.wait_for_everyone()
        rngs = [ckpt.rng_state()]
        if self.acc.num_processes > 1:  # every process's RNG streams, so a resumed run is exact on each
            from accelerate.utils import gather_object

            rngs = gather_object(rngs)
        path = None
        if self.acc.is_main_process:
            state = {
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "best_eval": self.best_eval,
                "last_eval": self.last_eval,
                "callbacks": [cb.state_dict() for cb in self.setup.callbacks],
            }
            path = ckpt.save_checkpoint(
                self.run_dir, self.step, self.acc.unwrap_model(self.model), self.optimizer, self.scheduler,
                state, tokenizer=self.setup.tokenizer, keep=self.cfg.keep_checkpoints, rank_rng=rngs,
                scaler=self.acc.scaler,
            )
            if self.metrics_mark is not None:
                self.mark_metrics()
            for hook in self.on_checkpoint:
                hook(path)
        self.acc.wait_for_everyone()
        self._keep(path)
        return path

    def _keep(self, path: Path | None) -> None:
        """What a stop by a signal (SIGINT, SIGTERM: :mod:`memlab.interrupts`) keeps: this checkpoint."""
        if path is not None:
            interrupts.keep(f"checkpoint {path} (memlab train --resume {self.run_dir} continues from it)")

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler, RNG, callbacks and data position from a checkpoint."""
        ckpt.load_model_weights(self.acc.unwrap_model(self.model), path)
        self.optimizer.load_state_dict(ckpt.load_torch(path / "optimizer.pt"))
        self.scheduler.load_state_dict(ckpt.load_torch(path / "scheduler.pt"))
        state = ckpt.load_trainer_state(path)
        self.step = state["step"]
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
        self.best_eval = state.get("best_eval")
        self.last_eval = state.get("last_eval") or {}
        for cb, st in zip(self.setup.callbacks, state.get("callbacks", [])):
            cb.load_state_dict(st)
        rng_file = path / f"rng-{self.acc.process_index}.pt"
        if not rng_file.is_file():
            raise MemlabError(f"{path} holds no RNG state for process {self.acc.process_index}; "
                              "resume with the number of processes the run was saved with")
        ckpt.set_rng_state(ckpt.load_torch(rng_file))
        self._keep(Path(path))
        if self.acc.scaler is not None and (path / "scaler.pt").is_file():
            self.acc.scaler.load_state_dict(ckpt.load_torch(path / "scaler.pt"))
        if self.acc.is_main_process:
            ckpt.remove_partial_checkpoints(self.run_dir)
            from memlab.train.metrics_log import truncate_metrics

            truncate_metrics(self.metrics_path, self.step)  # records past the checkpoint go; a torn last line too

    def mark_metrics(self) -> None:
        """Note ``metrics.jsonl``'s size now, and again at every checkpoint (``metrics_mark``: where a failed
        resume cuts it back to, :func:`memlab.outdir.cut_back`)."""
        self.metrics_mark = self.metrics_path.stat().st_size if self.metrics_path.is_file() else 0

    # ------------------------------------------------------------------ main loop
    def train(self) -> dict[str, Any]:
        """Step until ``max_steps``: log, evaluate and save on their schedules; return the run summary."""
        if self.step >= self.cfg.max_steps:
            raise MemlabError(f"the run already finished at step {self.step}; resume with train.max_steps=N (N > {self.step}) to extend it")
        self.model.train()
        bar = self._progress_bar()
        matmul = self._reference_flops()
        t_start = time.perf_counter()
        self._t_window, self._examples_window, examples_total = time.perf_counter(), 0, 0
        self._flops_window = flops_total = 0.0  # training FLOPs, each step at its own rate (curriculum phases differ)
        while self.step < self.cfg.max_steps:
            lr, grad_norm = self._optimizer_step()
            step_flops = self.cfg.batch_size * self._step_flops if matmul else 0.0
            self._examples_window += self.cfg.batch_size
            self._flops_window += step_flops
            examples_total += self.cfg.batch_size
            flops_total += step_flops
            bar.update(1)
            self._after_step(lr, grad_norm, matmul, bar)
        bar.close()
        return self._summary(time.perf_counter() - t_start, examples_total, flops_total, matmul)

    def _progress_bar(self):
        # a bar on a terminal, plain lines every minute in a log, nothing with train.progress=false
        return progress_bar(self.cfg.max_steps, "train", self.cfg.progress, initial=self.step, leave=True,
                            enabled=self.acc.is_main_process)

    def _reference_flops(self) -> float:
        """Matmul FLOP/s of this device, the MFU reference (0 when the setup gives no FLOPs per example)."""
        if not self.setup.flops_per_example:
            return 0.0
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(self.acc.mixed_precision), torch.float32)
        return measure_matmul_flops(self.acc.device, dtype, n=4096 if self.acc.device.type == "cuda" else 1024)

    def _optimizer_step(self) -> tuple[float, torch.Tensor | None]:
        """One optimizer step over the accumulated micro-batches; no value is read back from the device."""
        cfg, model = self.cfg, self.model
        for cb in self.setup.callbacks:
            cb.on_step_start(self.step)
        self._step_flops = self.setup.step_flops_per_example() if self.setup.flops_per_example else 0.0  # this phase's
        micro = self._micro_batches()
        # one process, one micro-batch: the batch's loss itself; else every micro-batch's loss times its weight,
        # and the gradients divided by the global batch's weight afterwards, so the step minimises the
        # weighted mean that is logged whatever the split (1 process or N, with or without accumulation)
        plain = len(micro) == 1 and self.acc.num_processes == 1
        weights = []
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            ctx = self.acc.no_sync(model) if (not last and self.acc.num_processes > 1) else contextlib.nullcontext()
            with ctx:
                with self.acc.autocast():
                    out: StepOutput = self.setup.loss_fn(model, batch)
                w = out.weight.detach() if torch.is_tensor(out.weight) else out.weight
                self.acc.backward(out.loss if plain else out.loss * w)
            weights.append(w)
            self.window.add(out, self.step)
        if not plain:
            self._divide_gradients(weights)
        grad_norm = None
        if cfg.clip_grad > 0:
            grad_norm = self.acc.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.clip_grad)
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._advance_data()
        return lr, grad_norm

    def _divide_gradients(self, weights: list) -> None:
        """Gradients of ``sum(loss * weight)`` -> of the global batch's weighted mean loss (no host read)."""
        total = torch.zeros((), dtype=torch.float32, device=self.acc.device)
        for w in weights:
            total = total + (w.to(total) if torch.is_tensor(w) else float(w))
        if self.acc.num_processes > 1:
            total = self.acc.reduce(total, reduction="sum")  # the gradient all-reduce averages: x processes below
        scale = self.acc.num_processes / total.clamp(min=1e-6)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, scale)

    def _after_step(self, lr: float, grad_norm, matmul: float, bar) -> None:
        """Log, evaluate and save when their step comes; a non-finite loss stops the run before any of them."""
        cfg, final = self.cfg, self.step == self.cfg.max_steps
        log = self.step % cfg.log_every == 0 or final
        evaluate = self.step % cfg.eval_every == 0 or final
        save = self.step % cfg.save_every == 0 or final
        if log or evaluate or save:
            self._stop_if_nonfinite()
        if log:
            self._log_train(lr, grad_norm, matmul, bar)
        if evaluate:
            self._run_eval()
        if save:
            self.save()

    def _stop_if_nonfinite(self) -> None:
        bad = self.window.first_nonfinite()
        if bad is None:
            return
        step, value = bad
        try:
            good = ckpt.newest_intact_checkpoint(self.run_dir, warn=lambda m: None)
        except MemlabError:
            good = None
        raise MemlabError(f"the loss became {value} at step {step + 1}; lower train.lr or check the data (last good "
                          f"checkpoint: {good or 'none'}; nothing was saved after it)")

    def _log_train(self, lr: float, grad_norm, matmul: float, bar) -> None:
        m = self.window.read()
        dt = time.perf_counter() - self._t_window
        n = self._examples_window
        rec = {"step": self.step, "split": "train", **m, "lr": lr, "examples_per_s": n / dt, "epoch": self.epoch}
        if grad_norm is not None:
            rec["grad_norm"] = float(grad_norm)
        if self.setup.tokens_per_example:
            rec["tokens_per_s"] = n * self.setup.tokens_per_example / dt
        mfu = model_flops_utilization(self._flops_window, dt, matmul, self.acc.num_processes)
        if mfu is not None:
            rec["mfu"] = mfu
            rec["flops_per_example"] = self._flops_window / n
        self._log(rec)
        bar.set_postfix(loss=f"{m['loss']:.3f}")
        warning = self.uniform.update(self.step, m["loss"])
        if warning and self.acc.is_main_process:
            print(f"memlab: warning: {warning}", file=sys.stderr)
        self.window.reset()
        self._t_window, self._examples_window, self._flops_window = time.perf_counter(), 0, 0.0

    def _summary(self, wall: float, examples_total: int, flops_total: float, matmul: float) -> dict[str, Any]:
        summary = {
            "steps": self.step,
            "wall_seconds": wall,
            "examples_per_s": examples_total / wall if wall > 0 else None,
            "eval": self.last_eval,
            "best_eval_loss": self.best_eval,
            "processes": self.acc.num_processes,
            "device": str(self.acc.device),
            "threads": torch.get_num_threads(),
            "mixed_precision": self.acc.mixed_precision,
            "parameters": sum(p.numel() for p in self.acc.unwrap_model(self.model).parameters()),
            **self.setup.summary,
        }
        if self.setup.tokens_per_example and wall > 0:
            summary["tokens_per_s"] = examples_total * self.setup.tokens_per_example / wall
        mfu = model_flops_utilization(flops_total, wall, matmul, self.acc.num_processes)
        if mfu is not None:
            summary["matmul_flops_per_s"] = matmul
            summary["mfu"] = mfu
        return summary
