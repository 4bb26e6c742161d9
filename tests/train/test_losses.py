"""``linear_cross_entropy`` against the plain computation (``F.linear`` + ``F.cross_entropy`` + argmax), and the
model and space paths that use it against their logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memlab.losses import linear_cross_entropy


def _plain(h, w, y, b=None):
    logits = F.linear(h, w, b).float()
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum")
    keep = y != -100
    return total, ((logits.argmax(-1) == y) & keep).sum(), keep.sum()


def _leaves(*ts):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block", [None, 7, 1000])
def test_values_and_gradients_match_the_plain_computation(bias, block):
    torch.manual_seed(0)
    h = torch.randn(3, 11, 16, requires_grad=True)
    w = (0.3 * torch.randn(50, 16)).requires_grad_()
    b = torch.randn(50, requires_grad=True) if bias else None
    y = torch.randint(0, 50, (3, 11))
    y[0, :4] = -100
    y[2, -1] = -100
    ref_in, new_in = _leaves(h, w, *([b] if bias else [])), _leaves(h, w, *([b] if bias else []))
    ref = _plain(ref_in[0], ref_in[1], y, ref_in[2] if bias else None)
    new = linear_cross_entropy(new_in[0], new_in[1], y, bias=new_in[2] if bias else None, block_rows=block)
    assert torch.allclose(new[0], ref[0], rtol=1e-5)
    assert int(new[1]) == int(ref[1]) and int(new[2]) == int(ref[2]) == 33 - 5
    (ref[0] * 0.7).backward()
    (new[0] * 0.7).backward()  # the upstream gradient scales the stored block gradients
    for a, c in zip(ref_in, new_in):
        assert torch.allclose(c.grad, a.grad, atol=1e-6, rtol=1e-4)


def test_frozen_head_and_no_grad():
    torch.manual_seed(1)
    h = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(30, 8)  # frozen: no weight gradient is made
    y = torch.randint(0, 30, (20,))
    total, correct, n = linear_cross_entropy(h, w, y, block_rows=6)
    total.backward()
    h2 = h.detach().clone().requires_grad_()
    _plain(h2, w, y)[0].backward()
    assert w.grad is None and torch.allclose(h.grad, h2.grad, atol=1e-6)
    with torch.no_grad():
        t2, c2, _ = linear_cross_entropy(h, w, y)
    assert not t2.requires_grad and torch.allclose(t2, total) and int(c2) == int(correct)


def test_all_targets_ignored_and_bad_shapes():
    h = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(10, 8, requires_grad=True)
    total, correct, n = linear_cross_entropy(h, w, torch.full((4,), -100))
    total.backward()
    assert total.detach().item() == 0 and int(n) == 0 and h.grad.abs().max() == 0
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(h, w, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="width"):
        linear_cross_entropy(h, torch.randn(10, 7), torch.zeros(4, dtype=torch.long))


def test_autocast_bf16_is_close_to_float32():
    torch.manual_seed(2)
    h, w, y = torch.randn(64, 32), 0.2 * torch.randn(100, 32), torch.randint(0, 100, (64,))
    ref = _plain(h, w, y)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, _, _ = linear_cross_entropy(h, w, y, block_rows=16)
    assert total.dtype == torch.float32 and abs(float(total) - float(ref)) / float(ref) < 2e-2


def _tiny_memory():
    from memlab.models.memory import MemoryConfig, MemoryModel

    torch.manual_seed(0)
    return MemoryModel(MemoryConfig(vocab_size=60, chunk_len=6, encoder_hidden_size=32, hidden_size=32,
                                    encoder_intermediate_size=64, intermediate_size=64, encoder_heads=2,
                                    num_attention_heads=2, max_chunks=4, pad_token_id=0, bos_token_id=1,
                                    eos_token_id=2, blank_token_id=4, memory_injection="unrolled"))


@pytest.mark.parametrize("mode", ["own", "previous", "none"])
def test_memory_features_through_the_head_are_the_logits(mode):
    m = _tiny_memory().eval()
    ids = torch.randint(5, 60, (2, 3, 6))
    mem = None if mode == "none" else m.encode_chunks(ids)
    feats = m.decode_features(mem, ids, mode)  # (B, C, L, d)
    weight, bias = m.output_head()
    assert bias is None and torch.allclose(F.linear(feats, weight), m.decode(mem, ids, mode), atol=1e-5)


@pytest.mark.parametrize("name", ["next_token", "copy", "blank_copy", "causal_lm"])
def test_objectives_equal_their_logits_computation(name):
    from memlab.curricula import make_objective
    from memlab.curricula.objectives import token_stats

    m = _tiny_memory().train()
    obj = make_objective(name)
    ids = torch.randint(5, 60, (2, 3, 6))
    mask = torch.ones_like(ids)
    mask[1, 2, 3:] = 0  # a padded chunk
    batch = {"input_ids": ids, "attention_mask": mask}
    mem = m.encode_chunks(ids, mask)
    loss, acc, n = obj.decode_loss(m, batch, mem)
    dec, labels = obj.targets(m, ids, mask)
    ref_loss, ref_acc, ref_n = token_stats(m.decode(mem if obj.uses_memory else None, dec, obj.mode), labels)
    assert torch.allclose(loss, ref_loss, rtol=1e-5) and torch.allclose(acc, ref_acc) and n == ref_n


def test_memory_space_stats_equal_the_logits_path():
    from memlab.models.memory.space import MemorySpace
    from memlab.space import decoder_token_stats

    class _Tok:
        pad_token_id = 0

    space = MemorySpace(_tiny_memory(), _Tok())
    ids = torch.randint(5, 60, (4, 5))
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    z = space.encode(ids, mask).requires_grad_()
    dec, labels = space.decoder_inputs(ids, mask)
    total, correct, n = decoder_token_stats(space, z, dec, labels)
    logits = space.decode_logits(z, dec)
    ref = F.cross_entropy(logits.reshape(-1, 60), labels.reshape(-1), ignore_index=-100, reduction="sum")
    keep = labels != -100
    assert torch.allclose(total, ref, rtol=1e-5) and int(n) == int(keep.sum())
    assert int(correct) == int(((logits.argmax(-1) == labels) & keep).sum())
    g_new = torch.autograd.grad(total, z)[0]
    g_ref = torch.autograd.grad(ref, z)[0]
    assert torch.allclose(g_new, g_ref, atol=1e-5)


def test_confidently_wrong_rows_keep_their_exact_loss():
    """A target whose probability underflows float32 still gets ``logsumexp - logit`` (here about 300 nats)."""
    h = torch.tensor([[30.0, 0.0], [0.0, 1.0]], requires_grad=True)
    w = torch.tensor([[10.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    y = torch.tensor([1, 1])
    total, correct, n = linear_cross_entropy(h, w, y)
    ref = _plain(h, w, y)[0]
    assert float(ref.detach()) > 250 and torch.allclose(total, ref, rtol=1e-6) and int(correct) == 1


def test_tied_maxima_count_as_argmax_does():
    """Equal logits: argmax takes the first index, so only targets at index 0 are correct."""
    h = torch.zeros(4, 3)
    w = torch.zeros(5, 3)
    y = torch.tensor([0, 1, 4, 0])
    assert int(linear_cross_entropy(h, w, y)[1]) == int(_plain(h, w, y)[1]) == 2


def test_benchmark_script_reports_agreement_and_times(capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "linear_ce.py"
    spec = importlib.util.spec_from_file_location("linear_ce_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--rows", "300", "--width", "16", "--vocab", "500", "--reps", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agreement"]["correct_equal"] and out["agreement"]["loss_rel"] < 1e-5
    assert out["agreement"]["grad_weight_max"] < 1e-4 and out["seconds"]["plain"] > 0 and out["speedup"] > 0
