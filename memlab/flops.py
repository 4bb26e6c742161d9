"""Analytic FLOP counts used for throughput and model FLOPs utilisation (MFU).

Conventions (stated so MFU figures can be compared): a multiply-add is 2 FLOPs;
training costs 3x the forward pass (forward + backward); the forward pass of a
Transformer costs ``2 * N`` FLOPs per token for its ``N`` matrix parameters
(input embeddings excluded, an output head included) plus ``4 * L * T * d``
per token for attention scores and values over a context of ``T`` (full, not
halved for causal masks).
"""

from __future__ import annotations

import time

import torch


def matrix_params(model: torch.nn.Module, exclude_embeddings: bool = True) -> int:
    """Parameters that take part in matrix multiplies: 2-D weights, minus input embeddings."""
    emb = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} if exclude_embeddings else set()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    head_id = id(head.weight) if head is not None else None
    total = 0
    for p in model.parameters():
        if p.ndim >= 2 and (id(p) not in emb or id(p) == head_id):
            total += p.numel()
    return total


def transformer_forward_flops(n_matrix_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Forward FLOPs for one sequence of ``seq_len`` tokens."""
    return 2.0 * n_matrix_params * seq_len + 4.0 * n_layers * seq_len * seq_len * d_model


def transformer_train_flops(n_matrix_params: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training (forward + backward) FLOPs for one sequence."""
    return 3.0 * transformer_forward_flops(n_matrix_params, n_layers, d_model, seq_len)


def _cpu_sdpa_mapping() -> dict:
    """FLOP formulas for the CPU flash-attention kernels, which torch's counter does not list."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    out = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        out[fwd] = lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v)
    if bwd is not None:
        out[bwd] = lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v)
    return out


def measured_step_flops(loss_fn, model: torch.nn.Module, batch: dict) -> float:
    """FLOPs of one training step (``loss_fn(model, batch)`` forward + backward), counted by torch.

    Counts every matrix multiply and attention kernel the step runs, including
    those of frozen modules the loss passes through (e.g. a frozen sentence
    decoder: its forward pass and the backward pass to its inputs, no weight
    gradients). Gradients and RNG state are left as they were.
    """
    from torch.utils.flop_counter import FlopCounterMode

    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False, custom_mapping=_cpu_sdpa_mapping()) as fc:
        out = loss_fn(model, batch)
        out.loss.backward()
    for p, g in zip(params, saved):
        p.grad = g
    return float(fc.get_total_flops())


def measure_matmul_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.5) -> float:
    """FLOP/s of an ``n x n`` matrix multiply on ``device``, measured now (the MFU reference)."""
    g = torch.Generator(device="cpu").manual_seed(0)  # private: the global RNG stream stays untouched
    a = torch.randn(n, n, generator=g, dtype=dtype).to(device)
    b = torch.randn(n, n, generator=g, dtype=dtype).to(device)
    for _ in range(2):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def model_flops_utilization(flops: float, seconds: float, matmul_flops: float, processes: int) -> float | None:
    """MFU: model FLOPs done (``flops``, each step at its own curriculum phase's rate) per second over the
    measured matmul FLOP/s of all processes (None if unknown)."""
    if not (flops and matmul_flops and seconds > 0):
        return None
    return flops / seconds / (matmul_flops * processes)
