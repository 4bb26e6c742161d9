"""The probe decoder's training-time input dropout and the reconstruction's repetition penalty."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import ConfigError
from memlab.probes.decoder.model import ProbeDecoder, ProbeDecoderConfig
from memlab.probes.options import ProbeOptions, validate
from memlab.probes.readings import reconstruct_ids

V = 12


def _decoder(**kw) -> ProbeDecoder:
    torch.manual_seed(0)
    cfg = ProbeDecoderConfig(embed_dim=4, vocab_size=V, start_id=0, hidden_size=16, num_layers=1, num_heads=2,
                             max_len=8, **kw)
    return ProbeDecoder(cfg)


def test_input_dropout_replaces_teacher_inputs_by_the_start_token_in_training_only():
    dropped, plain = _decoder(input_dropout=0.5), _decoder()
    plain.load_state_dict(dropped.state_dict())
    z, ids = torch.randn(3, 4), torch.randint(1, V, (3, 8))  # (B, D), (B, T)
    dropped.train(), plain.train()
    torch.manual_seed(7)
    got = dropped(z, ids)  # (B, T, C)
    torch.manual_seed(7)
    mask = torch.rand(ids.shape) < 0.5  # the draw the decoder makes
    assert mask.any() and not mask.all()
    want = plain(z, ids.masked_fill(mask, 0))
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, plain(z, ids), atol=1e-4)  # the dropped tokens changed the logits
    dropped.eval(), plain.eval()
    assert torch.allclose(dropped(z, ids), plain(z, ids), atol=1e-6)  # evaluation sees every true token


class _Loop(torch.nn.Module):
    """Wraps a decoder so that its logits always favour token 3, then token 5 one nat lower."""

    def __init__(self, dec: ProbeDecoder):
        super().__init__()
        self.inner = dec
        self.config, self.to_compact, self.predict_full = dec.config, dec.to_compact, dec.predict_full

    def forward(self, z, ids):
        out = torch.zeros(ids.shape[0], ids.shape[1], self.inner.num_kept)  # (B, T, C)
        out[..., 3], out[..., 5] = 2.0, 1.0
        return out


def test_repeat_penalty_stops_a_greedy_loop():
    loop = _Loop(_decoder())
    z = torch.zeros(2, 4)
    plain = reconstruct_ids(loop, z, 6, repeat_penalty=0.0)
    assert plain.tolist() == [[3] * 6] * 2
    pen = reconstruct_ids(loop, z, 6, repeat_penalty=1.5)
    # 3 first; then 3 is at 0.5 < 5 at 1.0; once both are used, 3 leads again (0.5 vs -0.5)
    assert pen.tolist() == [[3, 5, 3, 3, 3, 3]] * 2
    # the decoder's own setting is the default
    loop.inner.config.repeat_penalty = 1.5
    assert reconstruct_ids(loop, z, 6).tolist() == pen.tolist()


@pytest.mark.parametrize("key,value", [("input_dropout", 1.0), ("input_dropout", -0.1), ("cond_dropout", 1.5),
                                       ("repeat_penalty", -1.0)])
def test_decoding_options_are_checked(key, value):
    with pytest.raises(ConfigError, match=key):
        validate(ProbeOptions(**{key: value}))
