"""The observed states as they would be stored at a lower precision, and the noise floor of a distance read off them.

``--states-dtype`` reads each observed state as a copy kept at that precision would give it back: ``bfloat16`` and
``float16`` a cast (round to nearest) and back to float32; ``int8`` and ``int4`` a symmetric quantisation of each
state vector on its own (one scale per position, ``s = max_i |x_i| / q`` with ``q`` = 127 or 7, each coordinate
``round(x_i / s)`` clamped to ``[-q, q]``), dequantised again. The candidates are still computed by the model in the
run's own dtype and compared with the copy.

A copy at a lower precision moves the state, so the true token's state no longer lies at float noise from it.
:func:`noise_floor` bounds how far, as a relative distance, from the copy alone (what a user holding only the copy
can compute): each coordinate of a cast is off by at most the unit roundoff ``u`` of its value (``2^-8`` for
bfloat16, ``2^-11`` for float16), so the state by at most ``u / (1 - u)`` of the copy's norm; each coordinate of an
integer copy by at most half a step, so the state by ``sqrt(D) s / 2`` over the copy's norm. Two candidates whose
distances to the copy differ by less than that floor cannot be told apart by these states: the position is
``ambiguous`` (:func:`memlab.probes.invert.positions.searcher.ambiguous`), never ``match``. At ``float32`` the states
are read as they are and the floor is 0: the search is the one it always was.
"""

from __future__ import annotations

import torch

from memlab.errors import ModelError
from memlab.probes.invert.options import STATES_DTYPES

DTYPES = STATES_DTYPES
"""The precisions ``--states-dtype`` reads the states at."""

CASTS = {"bfloat16": (torch.bfloat16, 2.0 ** -8), "float16": (torch.float16, 2.0 ** -11)}
"""A float precision -> its torch dtype and unit roundoff (round to nearest)."""

LEVELS = {"int8": 127, "int4": 7}
"""An integer precision -> the largest level of its symmetric range ``[-q, q]``."""


def read_as(states: torch.Tensor, dtype: str) -> torch.Tensor:
    """``states`` ``(..., D)`` as a copy at ``dtype`` gives them back, in float32 (one ModelError line when a state
    does not fit the precision: float16 above 65504)."""
    if dtype == "float32":
        return states
    x = states.float()
    if dtype in CASTS:
        back = x.to(CASTS[dtype][0]).float()
        if not torch.isfinite(back).all():
            top = float(x.abs().max())
            raise ModelError(f"--states-dtype {dtype}: the states do not fit it (their largest value {top:.6g} is above "
                             f"{torch.finfo(CASTS[dtype][0]).max:g}); give bfloat16, int8 or int4")
        return back
    if dtype in LEVELS:
        q = LEVELS[dtype]
        scale = x.abs().amax(dim=-1, keepdim=True) / q  # (..., 1) one scale per state vector
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return (torch.round(x / safe).clamp(-q, q) * safe) * (scale > 0)  # (..., D)
    raise ModelError(f"--states-dtype takes {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {dtype!r}")


def noise_floor(read: torch.Tensor, dtype: str) -> torch.Tensor:
    """The largest relative distance ``|h - read| / |read|`` ``(...,)`` at which the state ``h`` a copy ``read``
    ``(..., D)`` at ``dtype`` was made from can lie, computed from the copy alone (0 at float32)."""
    read = read.float()
    if dtype == "float32":
        return torch.zeros(read.shape[:-1])
    if dtype in CASTS:
        u = CASTS[dtype][1]
        return torch.full(read.shape[:-1], u / (1 - u))
    step = read.abs().amax(dim=-1) / LEVELS[dtype]  # the copy's largest level is its scale times q, exactly
    return read.shape[-1] ** 0.5 * step / 2 / read.norm(dim=-1).clamp_min(1e-30)


def measured_error(true: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """The relative distance ``(...,)`` between the true states and their copy: what the floor bounds."""
    true, read = true.float(), read.float()
    return (true - read).norm(dim=-1) / read.norm(dim=-1).clamp_min(1e-30)
