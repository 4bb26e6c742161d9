"""The EmbeddingSpace contract: a well-behaved space passes, broken ones fail."""

import pytest
import torch

from memlab.space import EmbeddingSpace, reconstruction_loss, tokenize
from memlab.testing import check_embedding_space
from toy_spaces import ToySpace, toy_tokenizer


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


def test_toy_space_passes(tok):
    torch.manual_seed(0)
    space = ToySpace(tok)
    assert isinstance(space, EmbeddingSpace)
    check_embedding_space(space)


def test_padding_sensitive_encoder_fails(tok):
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="padding"):
        check_embedding_space(ToySpace(tok, pad_invariant=False))


def test_non_causal_decoder_fails(tok):
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="causal|depends on the batch"):
        check_embedding_space(ToySpace(tok, causal=False))


def test_unshifted_labels_fail(tok):
    class Unshifted(ToySpace):
        def decoder_inputs(self, input_ids, attention_mask):
            dec_in, labels = super().decoder_inputs(input_ids, attention_mask)
            return labels.clamp(min=0), labels  # the decoder sees the token it must predict

    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="labels not shifted"):
        check_embedding_space(Unshifted(tok))


def test_labels_that_are_not_the_tokens_fail(tok):
    class Reversed(ToySpace):
        def decoder_inputs(self, input_ids, attention_mask):
            dec_in, labels = super().decoder_inputs(input_ids, attention_mask)
            return dec_in, labels.flip(1)

    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="not its tokens in order"):
        check_embedding_space(Reversed(tok))


def test_missing_member_fails(tok):
    class NoGenerate:
        dim = 4
        tokenizer = tok

        def encode(self, i, m): ...
        def decoder_inputs(self, i, m): ...
        def decode_logits(self, z, d): ...
        def encode_text(self, s): ...

    with pytest.raises(AssertionError, match="protocol"):
        check_embedding_space(NoGenerate())


def test_reconstruction_loss_is_token_cross_entropy(tok):
    torch.manual_seed(0)
    space = ToySpace(tok)
    ids, mask = tokenize(space, ["A short one.", "A somewhat longer sentence here."])
    z = space.encode(ids, mask)
    dec_in, labels = space.decoder_inputs(ids, mask)
    logits = space.decode_logits(z, dec_in)
    logp = logits.log_softmax(-1)
    keep = labels != -100
    direct = -logp[keep].gather(-1, labels[keep].unsqueeze(-1)).mean()
    assert torch.allclose(reconstruction_loss(space, z, ids, mask), direct, atol=1e-6)
