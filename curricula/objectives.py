"""Objectives: batch transforms plus losses, for any model with the memory-model interface
(``encode_chunks(ids, mask) -> (B, C, K, M)`` and ``decode(memories, decoder_input_ids, mode) -> (B, C, L, V)``)
that follows :class:`memlab.forward.RunsInForward`: calling an objective (``objective(model, batch)``, a
schedule, :class:`ObjectiveEvaluation`, :func:`evaluate_objectives`) runs all of its encoder and decoder
passes inside one ``model(mode="run", ...)``, so a DDP/FSDP-wrapped model trains as the bare one does.
:meth:`Objective.step` is the computation itself, on the bare model.

A batch holds ``input_ids`` ``(B, C, T)`` (or ``(B, T)``), optionally ``attention_mask`` (padded
sentences) and ``memories`` (cached outputs of a frozen encoder).

* ``next_token``: chunk ``c`` predicts its tokens from the memories of chunks ``< c`` and its own
  earlier tokens (teacher forced; the first token is predicted from memory alone).
* ``copy``: the same teacher-forced prediction, but reading the chunk's *own* memory.
* ``blank_copy``: rebuild the chunk from its own memory with every token input blanked, so nothing
  leaks from the inputs (the autoencoder).
* ``causal_lm``: next token with no memory at all (the baseline decoder).
* ``combined``: ``L = L_next_token + weight * L_copy`` on one encoder pass (``copy`` names the copy objective).

Token accuracy is the share of non-padding targets where the argmax equals the true token.
With an ``attention_mask`` (padded sentences), targets are the tokens followed by the end token,
as in the :mod:`memlab.space` teacher-forcing convention.
"""

from __future__ import annotations

import torch

from memlab import randomness
from memlab.errors import MemlabError
from memlab.forward import bare, check_runs_in_forward, run_in_forward
from memlab.losses import linear_cross_entropy, logits_cross_entropy
from memlab.registry import OBJECTIVES
from memlab.train.setup import StepOutput


def _cfg_ids(model) -> tuple[int, int, int, int]:
    c = model.config
    return c.bos_token_id, c.eos_token_id, (c.pad_token_id or 0), c.blank_id


def shifted_targets(model, ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher forcing: ``([bos, x_0 ..], [x_0 .., (eos)])``, both ``(B, C, L)``."""
    bos, eos, pad, _ = _cfg_ids(model)
    b, c, t = ids.shape
    start = torch.full((b, c, 1), bos, dtype=ids.dtype, device=ids.device)
    if mask is None:
        return torch.cat([start, ids[..., :-1]], -1), ids  # (B, C, T) each
    lengths = mask.long().sum(-1)  # (B, C)
    real = mask.bool()
    dec = torch.cat([start, ids.masked_fill(~real, pad)], -1)  # (B, C, T+1)
    labels = torch.cat([ids.masked_fill(~real, -100), torch.full_like(start, -100)], -1)  # (B, C, T+1)
    labels.scatter_(-1, lengths[..., None], eos)
    return dec, labels


def blank_targets(model, ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Blank copy: every decoder input is the blank id; labels as in :func:`shifted_targets`."""
    dec, labels = shifted_targets(model, ids, mask)
    return torch.full_like(dec, _cfg_ids(model)[3]), labels


Stats = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Mean CE, token accuracy and number of targets of one batch: three scalars on the batch's device."""


def token_stats(logits: torch.Tensor, labels: torch.Tensor) -> Stats:
    """Mean CE over targets != -100, token accuracy, number of targets (nothing is read back to the host)."""
    total, correct, n = logits_cross_entropy(logits, labels)
    return _means(total, correct, n)


def _means(total: torch.Tensor, correct: torch.Tensor, n: torch.Tensor) -> Stats:
    den = n.clamp(min=1)
    return total / den, correct / den, n


def decoder_stats(model, memories, dec: torch.Tensor, labels: torch.Tensor, mode: str,
                  seeds: torch.Tensor | None = None) -> Stats:
    """:func:`token_stats` of the decoder's logits; a model with ``decode_features``/``output_head`` runs its head
    block by block (:func:`memlab.losses.linear_cross_entropy`: same values, no full logits tensor). ``seeds``:
    the batch's per-example seeds (:mod:`memlab.randomness`) for the decoder's training noise."""
    if not hasattr(model, "decode_features"):
        return token_stats(model.decode(memories, dec, mode, seeds=seeds), labels)
    weight, bias = model.output_head()
    return _means(*linear_cross_entropy(model.decode_features(memories, dec, mode, seeds=seeds), weight, labels,
                                        bias=bias))


MODEL_NEEDS = ("encode_chunks", "decode")
_checked: set[type] = set()


def check_objective_model(model) -> None:
    """The model (bare or wrapped) follows :class:`memlab.forward.RunsInForward` and has the memory-model
    methods the objectives call inside its forward (checked once per model class)."""
    kind = type(bare(model))
    if kind not in _checked:
        check_runs_in_forward(model, "the memory objectives", MODEL_NEEDS)
        _checked.add(kind)


def _step_output(model, objective, batch: dict, memories):
    return objective.step(model, batch, memories)[0]


def _evaluation_groups(model, evaluation, batch: dict):
    return evaluation.groups(model, batch)


def _ids(batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    if ids.dim() == 2:
        ids = ids[:, None]
        mask = mask[:, None] if mask is not None else None
    return ids, mask


def memories_for(model, batch: dict) -> torch.Tensor:
    """Cached memories when the batch carries them (frozen encoder), else one parallel encoder call."""
    if batch.get("memories") is not None:
        return batch["memories"]
    ids, mask = _ids(batch)
    return model.encode_chunks(ids, mask)  # (B, C, K, M)


class Objective:
    """A batch transform (``targets``) plus a decoder memory mode; calling it gives a StepOutput.

    ``length``: train on the first ``length`` tokens of every chunk only (chunk-length curricula,
    e.g. blank copy of 8, then 16, then 32 tokens); the encoder sees only those tokens.
    """

    name = "objective"
    mode = "own"
    uses_memory = True

    def __init__(self, length: int | None = None):
        if length is not None and length < 1:
            raise MemlabError(f"objective '{self.name}': length must be >= 1, got {length}")
        self.length = length

    def batch_view(self, batch: dict) -> dict:
        """The batch cut to ``length`` tokens per chunk (cached memories cannot be cut)."""
        if not self.length:
            return batch
        if batch.get("memories") is not None:
            raise MemlabError(f"objective '{self.name}': 'length' cannot be used with cached (frozen-encoder) memories")
        out = {"input_ids": batch["input_ids"][..., : self.length]}
        if batch.get(randomness.SEED_KEY) is not None:
            out[randomness.SEED_KEY] = batch[randomness.SEED_KEY]
        if batch.get("attention_mask") is not None:
            out["attention_mask"] = batch["attention_mask"][..., : self.length]
        return out

    def targets(self, model, ids, mask):
        return shifted_targets(model, ids, mask)

    def decode_loss(self, model, batch: dict, memories) -> Stats:
        ids, mask = _ids(batch)
        dec, labels = self.targets(model, ids, mask)
        return decoder_stats(model, memories if self.uses_memory else None, dec, labels, self.mode,
                             batch.get(randomness.SEED_KEY))

    def whole_batch(self) -> bool:
        """True when this objective reads the batch as it is (no ``length`` cut), so it can share the batch's
        memories with other objectives (one encoder pass per batch in evaluation)."""
        return not self.length

    def step(self, model, batch: dict, memories=None) -> tuple[StepOutput, dict[str, Stats]]:
        """The StepOutput, and the :data:`Stats` of every plain objective computed on the whole batch on the
        way, by name (evaluation reads them instead of computing them again). ``memories``: the whole
        batch's, used only when :meth:`whole_batch`."""
        memories = memories if self.whole_batch() else None
        batch = self.batch_view(batch)
        if memories is None and self.uses_memory:
            memories = memories_for(model, batch)
        loss, acc, n = stats = self.decode_loss(model, batch, memories)
        out = StepOutput(loss=loss, metrics={"token_accuracy": acc, f"{self.name}_loss": loss,
                                             f"{self.name}_accuracy": acc}, weight=n)
        return out, ({self.name: stats} if self.whole_batch() else {})

    def __call__(self, model, batch: dict, memories=None) -> StepOutput:
        """The StepOutput, computed inside one forward of ``model`` (bare or wrapped)."""
        check_objective_model(model)
        return run_in_forward(model, _step_output, self, batch, memories)

    decoder_passes = 1


class NextToken(Objective):
    """Next token from the memories of earlier chunks (the memory LM)."""

    name, mode = "next_token", "previous"


class OwnMemory(Objective):
    """Rebuilding a chunk from its own memory, optionally from memory mixtures.

    ``mix``: share of chunks whose memory is replaced by a mixture ``sum_j w_j m_j`` of its own and
    ``mix_parts - 1`` other chunks' memories of the batch, weights uniform on the simplex (Dirichlet(1);
    for two parts ``a, 1 - a`` with ``a ~ U(0, 1)``). A model that predicts the next memory under
    uncertainty places it between sentences; trained on mixtures, the decoder hedges there instead of
    decoding such points to confident garbage. Training mode only; accuracy is against the chunk's own tokens.
    """

    mode = "own"
    mixture_targets = False
    """True: the target is the same mixture of the parts' tokens (``sum_j w_j CE_j``); False: the chunk's own."""

    def __init__(self, length: int | None = None, mix: float = 0.0, mix_parts: int = 2):
        super().__init__(length)
        if not 0.0 <= mix <= 1.0:
            raise MemlabError(f"objective '{self.name}': mix must be in [0, 1], got {mix}")
        if mix_parts < 2:
            raise MemlabError(f"objective '{self.name}': mix_parts must be >= 2, got {mix_parts}")
        self.mix, self.mix_parts = float(mix), int(mix_parts)

    def mixture(self, n: int, device, seeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Partners ``(n, P)`` (column 0: the chunk itself; the others: other chunks of the batch) and weights
        ``(n, P)`` (rows not mixed: ``[1, 0, ..]``). ``seeds`` ``(B,)`` with ``n = B * C``: each chunk's weights and
        coin come from its example's seed (:mod:`memlab.randomness`); its partners are other chunks of the same
        micro-batch, so they alone depend on how a batch is split."""
        p = self.mix_parts
        per = (n // seeds.shape[0],) if seeds is not None else (n,)

        def draw(cols: int, stream: int) -> torch.Tensor:  # (n, cols) uniforms
            shape = (*per, cols)
            return randomness.uniform(seeds, shape, stream, device=device).reshape(n, cols)

        own_idx = torch.arange(n, device=device)  # (n,)
        others = (own_idx[:, None] + 1 + (draw(p - 1, 21) * max(n - 1, 1)).long()) % n  # (n, P-1) not the chunk itself
        e = -draw(p, 22).log()  # (n, P) exponentials
        w = e / e.sum(1, keepdim=True)  # (n, P) uniform on the simplex
        own = torch.zeros_like(w)
        own[:, 0] = 1.0
        w = torch.where((draw(1, 23)[:, 0] < self.mix)[:, None], w, own)
        return torch.cat([own_idx[:, None], others], 1), w

    def decode_loss(self, model, batch: dict, memories) -> Stats:
        if not (self.mix and model.training):
            return super().decode_loss(model, batch, memories)
        ids, mask = _ids(batch)
        dec, labels = self.targets(model, ids, mask)  # (B, C, L) each
        flat = memories.flatten(0, 1)  # (N, K, M), N = B * C chunks
        seeds = batch.get(randomness.SEED_KEY)
        idx, w = self.mixture(flat.shape[0], flat.device, seeds)  # (N, P) each
        mixed = (w.to(flat.dtype)[..., None, None] * flat[idx]).sum(1).view_as(memories)  # (B, C, K, M)
        if not self.mixture_targets:
            return decoder_stats(model, mixed, dec, labels, self.mode, seeds)
        logits = model.decode(mixed, dec, self.mode, seeds=seeds).float().flatten(0, 1)  # (N, L, V)
        lab = labels.flatten(0, 1)  # (N, L)
        own = (lab != -100).float()
        acc = ((logits.argmax(-1) == lab).float() * own).sum() / own.sum().clamp(min=1)
        logp = logits.log_softmax(-1)  # (N, L, V)
        num = den = 0.0
        for j in range(self.mix_parts):
            y = lab[idx[:, j]]  # (N, L) the j-th part's targets
            keep = (y != -100).float()
            ce = -logp.gather(-1, y.clamp(min=0)[..., None])[..., 0]  # (N, L)
            num = num + (w[:, j, None] * keep * ce).sum()
            den = den + (w[:, j, None] * keep).sum()
        return num / den.clamp(min=1e-6), acc, own.sum()


class Copy(OwnMemory):
    """Teacher-forced rebuilding of a chunk from its own memory (``mix``: the memory is a mixture, the
    target stays the chunk, whose true earlier tokens the decoder reads: it learns to fall back on them)."""

    name = "copy"


class BlankCopy(OwnMemory):
    """Rebuild a chunk from its own memory with blanked token inputs (the autoencoder); with ``mix``, the
    target is the same mixture of the parts' tokens (nothing in the inputs says which part to rebuild)."""

    name = "blank_copy"
    mixture_targets = True

    def targets(self, model, ids, mask):
        return blank_targets(model, ids, mask)


class CausalLM(Objective):
    """Next token with no memory (the decoder as a plain causal LM; the baseline)."""

    name, mode, uses_memory = "causal_lm", "none", False


class Combined(Objective):
    """``L = L_next_token + weight * L_copy`` sharing one encoder pass.

    ``copy_length``: the copy term rebuilds only the first ``copy_length`` tokens of every chunk (from the
    memory of those tokens: a second, short encoder pass) while the next-token term trains on whole chunks,
    so a chunk-length curriculum can act on the copy term alone (phases of ``combined`` with ``copy_length``
    8, then 16, then none) without taking steps from next-token training.
    """

    name = "combined"
    decoder_passes = 2

    def __init__(self, weight: float = 1.0, copy: str = "blank_copy", length: int | None = None,
                 copy_length: int | None = None):
        super().__init__(length)
        if copy not in ("copy", "blank_copy"):
            raise MemlabError(f"combined: copy objective must be 'copy' or 'blank_copy', got {copy!r}")
        if copy_length is not None and (isinstance(copy_length, bool) or not isinstance(copy_length, int) or copy_length < 1):
            raise MemlabError(f"combined: copy_length must be an int >= 1, got {copy_length!r}")
        if copy_length is not None and length is not None and copy_length > length:
            raise MemlabError(f"combined: copy_length ({copy_length}) is longer than length ({length})")
        self.weight = float(weight)
        self.ntp, self.copy = NextToken(), OBJECTIVES.get(copy)(length=copy_length)

    def step(self, model, batch: dict, memories=None) -> tuple[StepOutput, dict[str, Stats]]:
        memories = memories if self.whole_batch() else None
        batch = self.batch_view(batch)
        memories = memories if memories is not None else memories_for(model, batch)
        l_ntp, a_ntp, n = ntp = self.ntp.decode_loss(model, batch, memories)
        if self.copy.length:
            short = self.copy.batch_view(batch)  # the chunks' first copy_length tokens, encoded on their own
            l_cp, a_cp, _ = cp = self.copy.decode_loss(model, short, memories_for(model, short))
        else:
            l_cp, a_cp, _ = cp = self.copy.decode_loss(model, batch, memories)
        c = self.copy.name
        out = StepOutput(loss=l_ntp + self.weight * l_cp, weight=n, metrics={
            "token_accuracy": a_ntp, "next_token_loss": l_ntp, "next_token_accuracy": a_ntp,
            f"{c}_loss": l_cp, f"{c}_accuracy": a_cp})
        parts = {}
        if self.whole_batch():
            parts["next_token"] = ntp
            if not self.copy.length:
                parts[c] = cp
        return out, parts


for _cls in (NextToken, Copy, BlankCopy, CausalLM, Combined):
    OBJECTIVES.register(_cls.name, _cls, description=_cls.__doc__)


def make_objective(name: str, **kwargs) -> Objective:
    """Build a registered objective; unknown names and options are a MemlabError."""
    cls = OBJECTIVES.get(name)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise MemlabError(f"objective '{name}' does not take these options: {', '.join(kwargs)} ({e})") from None


class ObjectiveEvaluation:
    """One evaluation pass of a memory model per batch (the recipe's ``TrainSetup.eval_step_fn``): the
    training objective's StepOutput (``loss`` and its metrics) and the loss and accuracy of every
    objective in ``names``, from one encoder call per batch; an objective the training objective already
    ran on the whole batch is not run again. The values equal those of the loss function followed by
    :func:`evaluate_objectives` on the same batches.

    ``loss_objective``: a function returning the objective that trains now (a curriculum's changes)."""

    def __init__(self, loss_objective, names=("blank_copy", "copy", "next_token")):
        self.loss_objective = loss_objective
        self.objectives = [make_objective(n) for n in names]

    @torch.no_grad()
    def __call__(self, model, batch: dict) -> dict[str, StepOutput]:
        """The groups of one batch, computed inside one forward of ``model`` (bare or wrapped)."""
        check_objective_model(model)
        return run_in_forward(model, _evaluation_groups, self, batch)

    def groups(self, model, batch: dict) -> dict[str, StepOutput]:
        """:meth:`__call__`'s computation, on the bare model."""
        train = self.loss_objective()
        need = any(o.uses_memory for o in self.objectives) or (train.uses_memory and train.whole_batch())
        mem = memories_for(model, batch) if need else None
        out, done = train.step(model, batch, mem)
        done = {} if model.training else done  # a training-mode objective (memory mixtures) differs from the plain one
        groups = {"loss": out}
        for o in self.objectives:
            loss, acc, n = done[o.name] if o.name in done else o.decode_loss(model, batch, mem)
            groups[o.name] = StepOutput(loss=loss, metrics={f"{o.name}_loss": loss, f"{o.name}_accuracy": acc}, weight=n)
        return groups


@torch.no_grad()
def _objective_sums(model, objs, batch: dict) -> dict[str, torch.Tensor]:
    """``name -> (loss * n, accuracy * n, n)`` of each objective on one batch (one encoder pass), on the bare model."""
    mem = memories_for(model, batch) if any(o.uses_memory for o in objs) else None
    out = {}
    for o in objs:
        loss, acc, n = o.decode_loss(model, batch, mem)
        n = n.double()
        out[o.name] = torch.stack([loss.double() * n, acc.double() * n, n])  # (3,)
    return out


def evaluate_objectives(model, batches, names=("blank_copy", "copy", "next_token")) -> dict[str, float]:
    """Mean loss and token accuracy of each named objective over ``batches`` (target-weighted); the sums stay on
    the device and are read once at the end."""
    objs = [make_objective(n) for n in names]
    check_objective_model(model)
    sums: dict[str, torch.Tensor] = {}
    for batch in batches:
        for name, s in run_in_forward(model, _objective_sums, objs, batch).items():
            sums[name] = sums[name] + s if name in sums else s
    if not sums:
        return {o.name + k: 0.0 for o in objs for k in ("_loss", "_accuracy")}
    names_ = list(sums)
    vals = torch.stack([sums[k] for k in names_]).tolist()  # (O, 3): one read
    out = {}
    for name, (l, a, n) in zip(names_, vals):
        out[f"{name}_loss"], out[f"{name}_accuracy"] = l / max(n, 1), a / max(n, 1)
    return out
