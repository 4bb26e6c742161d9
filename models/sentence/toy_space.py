"""A tiny sentence autoencoder that implements the EmbeddingSpace protocol.

It exists so that SONAR-LLM and the LCM baselines can be developed, tested
and demonstrated without the memory autoencoder or real SONAR: a
bidirectional Transformer encoder mean-pools a sentence into one vector of
width ``dim``; a causal Transformer decoder reads that vector as a prefix slot
and rebuilds the sentence. :func:`fit_toy_space` trains it for a few steps on
sentences; :func:`save_toy_space` / :func:`load_toy_space` round-trip it.

Registered in ``SPACES`` as ``toy_ae``: the spec ``toy_ae:DIR`` loads a saved
one, ``toy_ae`` alone builds a seeded random one over a byte-level tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from memlab.decoding import beam_search_recompute, top_p_filter
from memlab.errors import ModelError
from memlab.registry import SPACES
from memlab.space import tokenize

CONFIG_NAME = "toy_ae.json"


def byte_tokenizer():
    """A byte-level tokenizer with no merges (256 bytes + pad/bos/eos/unk); needs no training data."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):  # sorted: alphabet() comes from a set
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


class _Block(nn.Module):
    """Pre-norm self-attention + MLP block; ``causal`` picks the decoder's mask."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        B, T, W = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)  # 3x (B, H, T, d)
        mask = None
        if key_mask is not None:
            mask = key_mask[:, None, None, :].bool()  # (B, 1, 1, T)
        if causal:
            c = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
            mask = c if mask is None else (mask & c)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, d)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, W))
        return x + self.mlp(self.norm2(x))


class ToySentenceAE(nn.Module):
    """Encoder (mean-pooled bidirectional Transformer) + causal decoder reading the vector as a prefix."""

    def __init__(self, tokenizer, dim: int = 32, width: int = 64, layers: int = 2, heads: int = 4, max_len: int = 256,
                 spec: str = "toy_ae"):
        super().__init__()
        self.tokenizer = tokenizer
        self.dim, self.width, self.layers, self.heads, self.max_len = dim, width, layers, heads, max_len
        self.max_tokens = max_len
        """Longest sentence (tokens) the encoder takes."""
        self.spec = spec
        V = len(tokenizer)
        self.tok_emb = nn.Embedding(V, width)
        self.pos_emb = nn.Embedding(max_len + 1, width)
        self.enc = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.enc_out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, dim))
        self.z_in = nn.Linear(dim, width)
        self.dec = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.dec_norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, V)

    # ----------------------------------------------------------------- protocol
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.max_len:
            raise ModelError(f"toy_ae: {input_ids.shape[1]} tokens, more than the space allows ({self.max_len})")
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.tok_emb(input_ids) + self.pos_emb(pos)  # (B, T, W)
        for blk in self.enc:
            h = blk(h, attention_mask, causal=False)
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)  # (B, W)
        return self.enc_out(pooled)  # (B, D)

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer
        B = input_ids.shape[0]
        lengths = attention_mask.sum(1)  # (B,)
        bos = torch.full((B, 1), tok.bos_token_id, dtype=input_ids.dtype, device=input_ids.device)
        pad = torch.full((B, 1), tok.pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
        ids = torch.where(attention_mask.bool(), input_ids, torch.full_like(input_ids, tok.pad_token_id))
        dec_in = torch.cat([bos, ids], 1)  # (B, T+1)
        labels = torch.cat([ids, pad], 1).clone()  # (B, T+1)
        pos = torch.arange(labels.shape[1], device=labels.device)[None]  # (1, T+1)
        labels[pos == lengths[:, None]] = tok.eos_token_id
        labels[pos > lengths[:, None]] = -100
        return dec_in, labels

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        if z.shape[-1] != self.dim:
            raise ModelError(f"toy_ae: embeddings of width {z.shape[-1]}, the space's width is {self.dim}")
        T = decoder_input_ids.shape[1]
        pos = torch.arange(T + 1, device=decoder_input_ids.device)
        h = torch.cat([self.z_in(z.to(self.z_in.weight.dtype)).unsqueeze(1), self.tok_emb(decoder_input_ids)], 1)
        h = h + self.pos_emb(pos.clamp(max=self.max_len))  # (B, T+1, W)
        for blk in self.dec:
            h = blk(h, None, causal=True)
        return self.lm_head(self.dec_norm(h[:, 1:]))  # (B, T, V)

    @torch.no_grad()
    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, do_sample: bool = False, temperature: float = 1.0,
                 top_p: float = 1.0, num_beams: int = 1, length_penalty: float = 1.0) -> list[str]:
        """Greedy, sampling (``do_sample``, ``temperature``, ``top_p``) or beam search (``num_beams``)."""
        tok = self.tokenizer
        B = z.shape[0]
        if num_beams > 1:
            if do_sample:
                raise ModelError("choose beam search (num_beams > 1) or sampling (do_sample=True), not both")
            rows = beam_search_recompute(self.decode_logits, z, tok.bos_token_id, tok.eos_token_id,
                                         min(max_new_tokens, self.max_len - 1), num_beams, length_penalty)
            return [tok.decode(r, skip_special_tokens=True) for r in rows]
        ids = torch.full((B, 1), tok.bos_token_id, dtype=torch.long, device=z.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=z.device)
        for _ in range(min(max_new_tokens, self.max_len - 1)):
            logits = self.decode_logits(z, ids)[:, -1].float()  # (B, V)
            if do_sample:
                probs = top_p_filter(torch.softmax(logits / max(temperature, 1e-5), -1), top_p)
                nxt = torch.multinomial(probs, 1).squeeze(1)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
            ids = torch.cat([ids, nxt[:, None]], 1)
            done |= nxt == tok.eos_token_id
            if done.all():
                break
        out = []
        for row in ids[:, 1:].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            out.append(tok.decode(row, skip_special_tokens=True))
        return out

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        ids, mask = tokenize(self, sentences)
        dev = self.tok_emb.weight.device
        return self.encode(ids.to(dev), mask.to(dev))


def fit_toy_space(space: ToySentenceAE, sentences: list[str], steps: int = 200, batch_size: int = 32, lr: float = 3e-3,
                  seed: int = 0, log_every: int = 0) -> list[float]:
    """Train the toy autoencoder to rebuild ``sentences``; returns the loss per step."""
    from memlab.space import reconstruction_loss
    from memlab.train.schedule import warmup_cosine

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(space.parameters(), lr=lr)
    space.train()
    losses = []
    for step in range(steps):
        idx = torch.randint(len(sentences), (batch_size,), generator=g).tolist()
        ids, mask = tokenize(space, [sentences[i] for i in idx], max_length=space.max_len)
        loss = reconstruction_loss(space, space.encode(ids, mask), ids, mask)
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = lr * warmup_cosine(step, 0, steps)
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            print(f"toy_ae fit step {step + 1}/{steps}: loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    space.eval()
    return losses


def save_toy_space(space: ToySentenceAE, out_dir: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(dim=space.dim, width=space.width, layers=space.layers, heads=space.heads, max_len=space.max_len)
    (out / CONFIG_NAME).write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in space.state_dict().items()}, str(out / "model.safetensors"))
    space.tokenizer.save_pretrained(str(out))
    return out


def load_toy_space(spec: str | None = None, **kw) -> ToySentenceAE:
    """``None`` -> a seeded random space (byte tokenizer, dim 32); a folder -> the space saved there."""
    if not spec:
        torch.manual_seed(kw.get("seed", 0))
        return ToySentenceAE(byte_tokenizer(), dim=kw.get("dim", 32)).eval()
    from safetensors.torch import load_file

    from memlab.data.tokenizer import load_tokenizer

    d = Path(spec)
    if not (d / CONFIG_NAME).is_file():
        raise ModelError(f"toy_ae: {d} holds no {CONFIG_NAME} (save one with save_toy_space)")
    cfg = json.loads((d / CONFIG_NAME).read_text())
    space = ToySentenceAE(load_tokenizer(str(d)), spec=f"toy_ae:{d.resolve()}", **cfg)
    space.load_state_dict(load_file(str(d / "model.safetensors")))
    return space.eval()


SPACES.register("toy_ae", load_toy_space, description="tiny test sentence autoencoder (toy_ae or toy_ae:DIR)")
