"""Reusable contract checks. Every space (memory autoencoder, SONAR, a fitted
probe) must pass :func:`check_embedding_space`; its tests call it on a toy
instance.
"""

from __future__ import annotations

import torch

from memlab.space import EmbeddingSpace, reconstruction_loss, tokenize

DEFAULT_SENTENCES = [
    "It is a truth universally acknowledged.",
    "Mr. Darcy said nothing.",
    "The weather was fine, and the party set out early for the abbey.",
]


def _rows(z: torch.Tensor) -> torch.Tensor:
    return z if z.dim() == 2 else z.flatten(1)


@torch.no_grad()
def _no_grad_checks(space: EmbeddingSpace, sentences: list[str], atol: float) -> None:
    ids, mask = tokenize(space, sentences)
    assert ids.shape == mask.shape and ids.dim() == 2
    z = space.encode(ids, mask)
    assert z.dim() in (2, 3), f"encode must return (B, D) or (B, K, D), got {tuple(z.shape)}"
    assert z.shape[0] == len(sentences) and z.shape[-1] == space.dim, f"bad embedding shape {tuple(z.shape)} for dim {space.dim}"
    assert torch.isfinite(z).all(), "embeddings must be finite"
    # encode_text is the same computation
    zt = space.encode_text(sentences)
    assert zt.shape == z.shape and torch.allclose(_rows(zt).float(), _rows(z).float(), atol=atol), "encode_text != encode"
    # padding invariance: a sentence alone encodes as it does inside a padded batch
    for i, s in enumerate(sentences):
        ids1, mask1 = tokenize(space, [s])
        z1 = space.encode(ids1, mask1)
        assert torch.allclose(_rows(z1)[0].float(), _rows(z)[i].float(), atol=atol), f"padding changes the embedding of sentence {i}"
    # determinism
    assert torch.equal(space.encode(ids, mask), z), "encode must be deterministic in eval mode"
    # decoder inputs and teacher-forced logits
    dec_in, labels = space.decoder_inputs(ids, mask)
    assert dec_in.shape == labels.shape and dec_in.shape[0] == len(sentences)
    n_targets = (labels != -100).sum(1)
    assert (n_targets >= mask.sum(1)).all(), "every real token must be a target"
    for i in range(len(sentences)):  # the labels are the row's tokens, in order (end tokens may follow)
        real = labels[i][labels[i] != -100]
        row = ids[i][mask[i].bool()]
        assert torch.equal(real[: len(row)], row), f"labels of row {i} are not its tokens in order"
    logits = space.decode_logits(z, dec_in)
    assert logits.shape[:2] == dec_in.shape, f"logits {tuple(logits.shape)} vs decoder inputs {tuple(dec_in.shape)}"
    assert logits.shape[-1] > int(ids.max()), "vocabulary smaller than the token ids"
    assert torch.isfinite(logits).all()
    # batch independence: a row decoded alone matches the batch at its target positions
    for i in range(len(sentences)):
        li = space.decode_logits(z[i : i + 1], dec_in[i : i + 1])
        keep = labels[i] != -100
        assert torch.allclose(li[0][keep].float(), logits[i][keep].float(), atol=atol * 10), f"row {i} depends on the batch"
    # causality: changing a later decoder input leaves earlier logits alone
    t = int(n_targets.min().item()) // 2 + 1
    if t < dec_in.shape[1]:
        changed = dec_in.clone()
        changed[:, t:] = (changed[:, t:] + 1) % logits.shape[-1]
        l2 = space.decode_logits(z, changed)
        assert torch.allclose(l2[:, :t].float(), logits[:, :t].float(), atol=atol * 10), "the decoder must be causal"
    # no leak: the decoder inputs up to the position that predicts token 0 do not contain token 0
    swapped = ids.clone()
    swapped[:, 0] = ids[:, 0].roll(1)
    if not torch.equal(swapped, ids):
        dec2, _ = space.decoder_inputs(swapped, mask)
        l4 = space.decode_logits(z, dec2)
        for i in range(len(sentences)):
            p = int((labels[i] != -100).nonzero()[0])
            assert torch.allclose(l4[i, : p + 1].float(), logits[i, : p + 1].float(), atol=atol * 10), (
                f"row {i}: the decoder input already holds the token it must predict (labels not shifted)")
    # embeddings matter: a different z changes the logits
    l3 = space.decode_logits(z.flip(0), dec_in)
    assert not torch.allclose(l3.float(), logits.float()), "the decoder ignores the embedding"
    # generation
    out = space.generate(z, max_new_tokens=8)
    assert isinstance(out, list) and len(out) == len(sentences) and all(isinstance(s, str) for s in out)
    assert out == space.generate(z, max_new_tokens=8), "greedy generation must be deterministic"


def check_embedding_space(space: EmbeddingSpace, sentences: list[str] | None = None, atol: float = 1e-4) -> None:
    """Assert that ``space`` honours the EmbeddingSpace contract (see :mod:`memlab.space`).

    Checks shapes, ``encode_text`` == ``encode``, padding invariance,
    determinism, the teacher-forcing convention, batch independence and
    causality of the decoder, that the decoder reads the embedding, that the
    reconstruction loss is finite and sends gradients back into the embedding
    (SONAR-LLM trains through a frozen decoder), that generation returns
    one string per embedding, and, for a space with ``decode_features`` and
    ``output_head``, that they give ``decode_logits`` and the same loss.
    """
    sentences = sentences or DEFAULT_SENTENCES
    assert isinstance(space, EmbeddingSpace), "missing a member of the EmbeddingSpace protocol"
    assert isinstance(space.dim, int) and space.dim > 0
    was_training = [m.training for m in _modules(space)]
    for m in _modules(space):
        m.eval()
    try:
        _no_grad_checks(space, sentences, atol)
        ids, mask = tokenize(space, sentences)
        with torch.no_grad():
            z = space.encode(ids, mask)
        z = z.detach().clone().requires_grad_(True)
        loss = reconstruction_loss(space, z, ids, mask)
        assert loss.dim() == 0 and torch.isfinite(loss), "reconstruction loss must be a finite scalar"
        loss.backward()
        assert z.grad is not None and z.grad.abs().sum() > 0, "no gradient reaches the embedding through the decoder"
        if hasattr(space, "decode_features") and hasattr(space, "output_head"):  # optional: the head applied by losses
            _check_features(space, z.detach(), ids, mask, atol)
        if hasattr(space, "input_embeddings") and hasattr(space, "encode_embeddings"):  # optional: a white-box encoder
            _check_white_box(space, ids, mask, atol)
    finally:
        for m, t in zip(_modules(space), was_training):
            m.train(t)


def _check_features(space, z: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, atol: float) -> None:
    """``decode_features`` through ``output_head`` must give ``decode_logits``, and the block-wise loss the plain one."""
    import torch.nn.functional as F

    from memlab.space import decoder_token_stats

    dec, labels = space.decoder_inputs(ids, mask)
    with torch.no_grad():
        logits = space.decode_logits(z, dec).float()
        weight, bias = space.output_head()
        feats = space.decode_features(z, dec)
        assert feats.shape == (*logits.shape[:-1], weight.shape[1]), "decode_features must be (B, T', d) for output_head's d"
        via_head = F.linear(feats, weight, bias).float()
        assert torch.allclose(via_head, logits, atol=atol * max(1.0, float(logits.abs().max()))), \
            "decode_features through output_head differs from decode_logits"
        labels = labels.to(logits.device)
        total, correct, count = decoder_token_stats(space, z, dec, labels)
        ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum")
        assert torch.allclose(total, ref, rtol=1e-4, atol=1e-4), "the block-wise loss differs from the plain cross-entropy"
        assert int(count) == int((labels != -100).sum())


def _check_white_box(space, ids: torch.Tensor, mask: torch.Tensor, atol: float) -> None:
    """``encode_embeddings`` of the table's rows must be ``encode`` of the ids, and send gradients to its inputs."""
    table = space.input_embeddings()
    assert table.dim() == 2 and table.shape[0] > int(ids.max()), "input_embeddings must be (V, D_e) for every id"
    with torch.no_grad():
        z = space.encode(ids, mask)
    e = table.detach()[ids.to(table.device)].clone().requires_grad_(True)  # (B, T, D_e)
    got = space.encode_embeddings(e, mask)
    assert got.shape == z.shape and torch.allclose(_rows(got).float(), _rows(z).float(), atol=atol), \
        "encode_embeddings of the ids' rows differs from encode"
    got.float().pow(2).sum().backward()
    assert e.grad is not None and e.grad.abs().sum() > 0, "encode_embeddings sends no gradient to its inputs"


def _modules(space) -> list[torch.nn.Module]:
    if isinstance(space, torch.nn.Module):
        return [space]
    return [v for v in vars(space).values() if isinstance(v, torch.nn.Module)]
