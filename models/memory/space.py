"""A trained memory autoencoder as an :class:`~memlab.space.EmbeddingSpace` (registered as ``memory_ae``).

``encode`` maps a padded batch of sentences/chunks ``(B, T)`` to their memories
(``(B, D)`` for one memory vector, ``(B, K, D)`` for several). The decoder
rebuilds the tokens followed by the end token; a blank-copy model
(``copy_inputs="blank"``) ignores the teacher-forced token values (it reads
only blanks and the memory), so it is trivially causal and generates in one
pass.
"""

from __future__ import annotations

from pathlib import Path

import torch

from memlab.decoding import beam_search_recompute, top_p_filter
from memlab.errors import ModelError
from memlab.models.memory.modeling_memory import MemoryModel
from memlab.paths import resource

PRETRAINED_DIR = resource("checkpoints", "memory_ae-small")
"""The memory autoencoder shipped with memlab: what ``space:memory_ae`` without a path loads."""


class MemorySpace:
    """Wraps a :class:`MemoryModel` and its tokenizer."""

    def __init__(self, model: MemoryModel, tokenizer):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.dim = int(model.config.space_dim)
        self.max_tokens = int(model.config.chunk_len)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ encoder half
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.max_tokens:
            raise ModelError(f"a sequence of {input_ids.shape[1]} tokens is longer than the space allows ({self.max_tokens})")
        mem = self.model.encode(input_ids.to(self.device), attention_mask.to(self.device))  # (B, K, D)
        return mem[:, 0] if mem.shape[1] == 1 else mem

    def input_embeddings(self) -> torch.Tensor:
        """The encoder's token embedding table ``(V, D_e)``: what :meth:`encode_embeddings` reads a token as."""
        return self.model.encoder_embeddings().weight

    def encode_embeddings(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`encode` from the encoder's input embeddings ``(B, T, D_e)`` (rows of :meth:`input_embeddings`),
        differentiable in them: what a white-box search of the memory vector (``memlab invert``) runs."""
        if embeds.shape[1] > self.max_tokens:
            raise ModelError(f"a sequence of {embeds.shape[1]} tokens is longer than the space allows "
                             f"({self.max_tokens})")
        mem = self.model.encode_embeddings(embeds.to(self.device), attention_mask.to(self.device))  # (B, K, D)
        return mem[:, 0] if mem.shape[1] == 1 else mem

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        """Tokenize (truncating to the model's chunk length) and encode."""
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, truncation=True,
                             max_length=self.max_tokens, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])

    # ------------------------------------------------------------------ decoder half
    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[bos, x_0 .. x_{n-1}]`` -> labels ``[x_0 .. x_{n-1}, eos]``; padding ``pad`` / ``-100``."""
        b, t = input_ids.shape
        cfg = self.config
        lengths = attention_mask.long().sum(1)  # (B,)
        dec = torch.full((b, t + 1), cfg.pad_token_id or 0, dtype=torch.long, device=input_ids.device)  # (B, T+1)
        labels = torch.full((b, t + 1), -100, dtype=torch.long, device=input_ids.device)  # (B, T+1)
        dec[:, 0] = cfg.bos_token_id
        pos = torch.arange(t, device=input_ids.device)[None]  # (1, T)
        real = pos < lengths[:, None]  # (B, T)
        dec[:, 1:] = torch.where(real, input_ids, dec[:, 1:])
        labels[:, :t] = torch.where(real, input_ids, labels[:, :t])
        labels[torch.arange(b), lengths] = cfg.eos_token_id
        return dec, labels

    def _memories(self, z: torch.Tensor) -> torch.Tensor:
        z = z.to(self.device)
        return (z[:, None] if z.dim() == 2 else z)[:, None]  # (B, 1, K, D)

    def _decoder_ids(self, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """``(B, 1, T')`` decoder inputs on the model's device; all blanks for a blank-copy decoder."""
        dec = decoder_input_ids.to(self.device)
        if self.config.copy_inputs == "blank":
            dec = torch.full_like(dec, self.config.blank_id)
        return dec[:, None]

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.decode(self._memories(z), self._decoder_ids(decoder_input_ids), "own").squeeze(1)  # (B, T', V); a view, so no copy in backward

    def decode_features(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced features ``(B, T', d)`` that :meth:`output_head` maps to :meth:`decode_logits`' logits."""
        return self.model.decode_features(self._memories(z), self._decoder_ids(decoder_input_ids), "own").squeeze(1)

    def output_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight (V, d), bias)`` of the decoder's output head."""
        return self.model.output_head()

    @torch.no_grad()
    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, num_beams: int = 1, length_penalty: float = 1.0,
                 **search) -> list[str]:
        """Greedy decoding; ``num_beams > 1``: beam search (:func:`memlab.decoding.beam_search`, hypotheses scored
        by ``sum log p / (length + 1) ** length_penalty``); ``do_sample``/``temperature``/``top_p``: sampling.
        A blank-copy decoder predicts every position at once, so it decodes greedily or by sampling only."""
        n = min(max_new_tokens, self.max_tokens + 1)
        b = z.shape[0]
        eos = self.config.eos_token_id
        if num_beams > 1 and search.get("do_sample"):
            raise ModelError("choose beam search (num_beams > 1) or sampling (do_sample=True), not both")
        if self.config.copy_inputs == "blank":
            if num_beams > 1:
                raise ModelError("beam search needs an autoregressive space decoder; this one is blank copy "
                                 "(copy_inputs='blank': every position at once), so it decodes greedily or by sampling")
            dec = torch.full((b, n), self.config.blank_id, dtype=torch.long, device=self.device)
            rows = self._pick(self.decode_logits(z, dec), search).tolist()  # (B, n)
        elif num_beams > 1:
            rows = beam_search_recompute(self.decode_logits, z.to(self.device), self.config.bos_token_id, eos, n,
                                         num_beams, length_penalty)
        else:
            out = torch.full((b, 1), self.config.bos_token_id, dtype=torch.long, device=self.device)
            for _ in range(n):
                nxt = self._pick(self.decode_logits(z, out)[:, -1:], search)  # (B, 1)
                out = torch.cat([out, nxt], 1)
            rows = out[:, 1:].tolist()
        return [self.tokenizer.decode(row[: row.index(eos)] if eos in row else row, skip_special_tokens=True)
                for row in rows]

    @staticmethod
    def _pick(logits: torch.Tensor, search: dict) -> torch.Tensor:
        if not search.get("do_sample"):
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / max(float(search.get("temperature", 1.0)), 1e-5), -1)  # (B, L, V)
        probs = top_p_filter(probs, float(search.get("top_p", 1.0)))
        return torch.multinomial(probs.flatten(0, 1), 1).view(probs.shape[:2])


def load(spec: str | None = None, device: str | None = None, **kw) -> MemorySpace:
    """``SPACES.get("memory_ae")(spec)``: ``spec`` is a run directory, a checkpoint or a ``save_pretrained``
    folder with the tokenizer saved beside the model; ``None`` loads the shipped one (:data:`PRETRAINED_DIR`)."""
    from memlab.loading import load_pretrained, load_run_tokenizer, resolve_model_dir

    path = Path(spec) if spec is not None else PRETRAINED_DIR
    if spec is None and not (path / "config.json").is_file():
        raise ModelError(f"no bundled memory autoencoder at {path}; pass a run directory or a saved model folder")
    d = resolve_model_dir(path)
    model = load_pretrained(d, MemoryModel)
    if device is not None:
        model.to(device)
    return MemorySpace(model, load_run_tokenizer(d))


def reconstruct(model_dir, prompts: list[str], opts) -> list[str]:
    """``memlab generate`` for memory models: encode each prompt to its memory and decode it back."""
    space = load(str(model_dir))
    z = space.encode_text(prompts)
    return space.generate(z, max_new_tokens=opts.max_new_tokens, do_sample=opts.sample, temperature=opts.temperature,
                          top_p=opts.top_p)
