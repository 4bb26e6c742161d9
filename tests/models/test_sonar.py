"""The native SONAR space: contract, family, converters, save/load, generation, real sizes (all CPU, toy sized)."""

import json

import pytest
import torch

from memlab.errors import MemlabError, ModelError
from memlab.models.sonar import SonarConfig, SonarModel, toy_space
from memlab.models.sonar.configuration_sonar import PRESETS
from memlab.models.sonar.convert import FS2_TO_HF
from memlab.registry import FAMILIES, SPACES
from memlab.space import reconstruction_loss, tokenize
from memlab.testing import DEFAULT_SENTENCES, check_embedding_space


@pytest.fixture(scope="module")
def space():
    return toy_space(seed=0)


def _outputs(space, sentences=DEFAULT_SENTENCES):
    ids, mask = tokenize(space, sentences)
    with torch.no_grad():
        z = space.encode(ids, mask)
        dec, _ = space.decoder_inputs(ids, mask)
        return z, space.decode_logits(z, dec)


def test_contract_on_toy(space):
    check_embedding_space(space)


def test_registered():
    assert "sonar" in SPACES.names() and "sonar" in FAMILIES.names()
    s = SPACES.get("sonar")("toy")
    assert s.dim == PRESETS["toy"]["d_model"]
    cfg = FAMILIES.get("sonar").make_config("basic")
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.encoder_attention_heads, cfg.encoder_ffn_dim,
            cfg.vocab_size) == (1024, 24, 24, 16, 8192, 256206)
    with pytest.raises(MemlabError, match="model.nope"):
        FAMILIES.get("sonar").make_config("toy", nope=1)


def test_special_tokens_layout(space):
    tok = space.tokenizer
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<s>", "<pad>", "</s>", "<unk>"]
    ids, mask = tokenize(space, ["Mr. Darcy said nothing.", "Hi"])
    full, fmask = space.with_specials(ids, mask)
    eng = tok.convert_tokens_to_ids("eng_Latn")
    n1 = int(mask[1].sum())
    assert full[1, 0] == eng and full[1, n1 + 1] == 2 and fmask[1].sum() == n1 + 2 and (full[1, n1 + 2:] == 1).all()
    dec, labels = space.decoder_inputs(ids, mask)
    assert dec[1, 0] == 2 and dec[1, 1] == eng and torch.equal(dec[1, 2:2 + n1], ids[1, :n1])
    assert labels[1, 0] == -100 and torch.equal(labels[1, 1:1 + n1], ids[1, :n1]) and labels[1, n1 + 1] == 2
    assert (labels[1, n1 + 2:] == -100).all()
    # another language changes the embedding; an unknown one is a clear error
    assert not torch.allclose(space.encode(ids, mask), space.encode(ids, mask, lang="fra_Latn"))
    with pytest.raises(ModelError, match="xyz_Latn"):
        space.encode(ids, mask, lang="xyz_Latn")


def test_toy_trains_one_batch():
    torch.manual_seed(0)
    s = toy_space(seed=1, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = s.model.train()
    ids, mask = tokenize(s, DEFAULT_SENTENCES)
    full, fmask = s.with_specials(ids, mask)
    dec, labels = s.decoder_inputs(ids, mask)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(8):
        out = model(full, fmask, decoder_input_ids=dec, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.75 * losses[0], losses


def test_save_load_roundtrip(space, tmp_path):
    space.save_pretrained(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["model_type"] == "memlab_sonar" and (tmp_path / "s" / "model.safetensors").is_file()
    again = SPACES.get("sonar")(str(tmp_path / "s"))
    z0, l0 = _outputs(space)
    z1, l1 = _outputs(again)
    assert torch.equal(z0, z1) and torch.equal(l0, l1)
    # the space is an nn.Module: its state dict is the model's, under "model."
    fresh = toy_space(seed=7)
    assert not torch.equal(_outputs(fresh)[0], z0)
    fresh.load_state_dict(space.state_dict())
    assert torch.equal(_outputs(fresh)[0], z0) and not fresh.training


def _to_fs2(sd: dict, part: str) -> dict:
    """memlab keys -> fairseq2 keys (written independently of the converter), control-token rows permuted back."""
    ren = [("self_attn.out_proj.", "self_attn.output_proj."), ("encoder_attn.out_proj.", "encoder_decoder_attn.output_proj."),
           ("encoder_attn_layer_norm.", "encoder_decoder_attn_layer_norm."), ("encoder_attn.", "encoder_decoder_attn."),
           ("fc1.", "ffn.inner_proj."), ("fc2.", "ffn.output_proj."), ("final_layer_norm.", "ffn_layer_norm.")]
    out = {}
    for k, v in sd.items():
        if not k.startswith(part + "."):
            continue
        if k == f"{part}.embed_tokens.weight":
            fs2 = v.clone()
            for a, b in FS2_TO_HF.items():
                fs2[a] = v[b]
            out[f"{part}_frontend.embed.weight"] = fs2
            if part == "decoder":
                out["final_proj.weight"] = fs2
            continue
        if k.startswith(f"{part}.layer_norm."):
            out[k[len("encoder."):] if part == "encoder" else k] = v.clone()
            continue
        for a, b in ren:
            if a in k:
                k = k.replace(a, b)
                break
        out[k] = v.clone()
    return out


def test_fairseq2_checkpoint_conversion(space, tmp_path):
    sd = space.model.state_dict()
    enc, dec = _to_fs2(sd, "encoder"), _to_fs2(sd, "decoder")
    assert "encoder.layers.1.ffn.inner_proj.weight" in enc and "layer_norm.weight" in enc
    assert "decoder.layers.0.encoder_decoder_attn.output_proj.bias" in dec
    torch.save({"model": enc}, tmp_path / "enc.pt")
    torch.save({"model": dec}, tmp_path / "dec.pt")
    loaded = SPACES.get("sonar")(f"{tmp_path}/enc.pt,{tmp_path}/dec.pt", tokenizer=space.tokenizer,
                                 num_heads=PRESETS["toy"]["encoder_attention_heads"],
                                 max_position_embeddings=PRESETS["toy"]["max_position_embeddings"])
    emb = loaded.model.encoder.embed_tokens.weight
    assert torch.equal(emb[0], enc["encoder_frontend.embed.weight"][2])  # <s> is fairseq2's row 2
    z0, l0 = _outputs(space)
    z1, l1 = _outputs(loaded)
    assert torch.equal(z0, z1) and torch.equal(l0, l1)
    # bad inputs: one clear error each
    with pytest.raises(ModelError, match="decoder"):
        SPACES.get("sonar")(str(tmp_path / "enc.pt"), tokenizer=space.tokenizer)
    with pytest.raises(ModelError, match="not found"):
        SPACES.get("sonar")(f"{tmp_path}/none.pt,{tmp_path}/dec.pt", tokenizer=space.tokenizer)
    dec["final_proj.weight"] = dec["final_proj.weight"] + 1
    torch.save({"model": dec}, tmp_path / "dec_untied.pt")
    with pytest.raises(ModelError, match="untied"):
        SPACES.get("sonar")(f"{tmp_path}/enc.pt,{tmp_path}/dec_untied.pt", tokenizer=space.tokenizer, num_heads=4)


def test_matches_transformers_m2m100_port(tmp_path):
    """A transformers M2M100 encoder/decoder (the format of the hub ports) computes what memlab computes after conversion."""
    from safetensors.torch import save_file
    from transformers import M2M100Config
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100Decoder, M2M100Encoder

    s = toy_space(seed=3)
    t = PRESETS["toy"]
    hf_cfg = M2M100Config(vocab_size=t["vocab_size"], d_model=t["d_model"], encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=t["encoder_ffn_dim"],
                          decoder_ffn_dim=t["decoder_ffn_dim"], max_position_embeddings=t["max_position_embeddings"],
                          scale_embedding=True, activation_function="relu", pad_token_id=1, dropout=0.0)
    torch.manual_seed(5)
    henc, hdec = M2M100Encoder(hf_cfg).eval(), M2M100Decoder(hf_cfg).eval()
    with torch.no_grad():
        for m in (henc, hdec):
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
    port = {f"model.encoder.{k}": v for k, v in henc.state_dict().items()}
    port.update({f"model.decoder.{k}": v for k, v in hdec.state_dict().items()})
    port["lm_head.weight"] = port["model.decoder.embed_tokens.weight"]
    (tmp_path / "port").mkdir()
    save_file({k: v.clone().contiguous() for k, v in port.items()}, str(tmp_path / "port" / "model.safetensors"))
    (tmp_path / "port" / "config.json").write_text(json.dumps(hf_cfg.to_dict()))
    s.tokenizer.save_pretrained(str(tmp_path / "port"))
    mine = SPACES.get("sonar")(str(tmp_path / "port"))  # one full port: both halves
    ids, mask = tokenize(mine, DEFAULT_SENTENCES)
    full, fmask = mine.with_specials(ids, mask)
    dec, labels = mine.decoder_inputs(ids, mask)
    with torch.no_grad():
        h = henc(input_ids=full, attention_mask=fmask).last_hidden_state  # (B, T, D)
        ref_z = (h * fmask[..., None]).sum(1) / fmask.sum(1, keepdim=True)
        z = mine.encode(ids, mask)
        hd = hdec(input_ids=dec, encoder_hidden_states=ref_z[:, None]).last_hidden_state
        ref_logits = hd @ hdec.embed_tokens.weight.T
        logits = mine.decode_logits(ref_z, dec)
    keep = labels != -100
    assert torch.allclose(z, ref_z, atol=1e-5, rtol=1e-5)
    assert torch.allclose(logits[keep], ref_logits[keep], atol=1e-4, rtol=1e-5)


def test_generation_consistent_with_teacher_forcing(space):
    z = space.encode_text(DEFAULT_SENTENCES[:2])
    from memlab.models.sonar.generation import generate_ids

    cfg = space.model.config
    prefix = [cfg.eos_token_id, space.tokenizer.convert_tokens_to_ids("eng_Latn")]
    with torch.no_grad():
        rows = generate_ids(space.model, z, prefix, cfg.eos_token_id, max_new_tokens=6)
        for i, row in enumerate(rows):  # the cached greedy path = argmax of the teacher-forced logits
            dec = torch.tensor([prefix + row])
            logits = space.model.decode(z[i:i + 1], dec)[0]  # (T, V)
            steps = logits[len(prefix) - 1:].argmax(-1).tolist()
            assert steps[:len(row)] == row
        beam1 = generate_ids(space.model, z, prefix, cfg.eos_token_id, max_new_tokens=6, num_beams=1)
        beam3 = generate_ids(space.model, z, prefix, cfg.eos_token_id, max_new_tokens=6, num_beams=3)
    assert beam1 == rows and len(beam3) == 2
    torch.manual_seed(0)
    out = space.generate(z, max_new_tokens=5, do_sample=True, top_p=0.9, temperature=0.7)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    with pytest.raises(ModelError):
        space.generate(z, num_beams=2, do_sample=True)


def test_gradient_reaches_embedding_through_frozen_decoder(space):
    ids, mask = tokenize(space, DEFAULT_SENTENCES)
    z = space.encode(ids, mask).detach().requires_grad_(True)
    loss = reconstruction_loss(space, z, ids, mask)
    loss.backward()
    assert z.grad.abs().sum() > 0 and torch.isfinite(loss)


def test_basic_size_on_meta_device():
    cfg = SonarConfig(**PRESETS["basic"])
    with torch.device("meta"):
        model = SonarModel(cfg)
    V, D, F, L = 256206, 1024, 8192, 24
    attn, ln, ffn = 4 * (D * D + D), 2 * D, D * F + F + F * D + D
    enc = V * D + L * (attn + 2 * ln + ffn) + ln
    dec = V * D + L * (2 * attn + 3 * ln + ffn) + ln
    n_enc = sum(p.numel() for p in model.encoder.parameters())
    n_dec = sum(p.numel() for p in model.decoder.parameters())
    assert (n_enc, n_dec) == (enc, dec)
    assert 760e6 < n_enc < 770e6  # SONAR's text encoder: about 766M parameters
    assert all(p.device.type == "meta" for p in model.parameters())


def test_bad_inputs(space):
    with pytest.raises(ModelError, match="at most"):
        space.model.encode(torch.ones(1, PRESETS["toy"]["max_position_embeddings"] + 1, dtype=torch.long))
    with pytest.raises(ModelError, match="empty"):
        space.model.encode(torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ModelError, match="do not fit"):
        space.decode_logits(torch.zeros(2, space.dim + 1), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ModelError, match="divisible"):
        SonarModel(SonarConfig(**{**PRESETS["toy"], "encoder_attention_heads": 5}))
    with pytest.raises(ModelError, match="neither a local folder"):
        SPACES.get("sonar")("/nonexistent/sonar-port")
