"""The fitted probe as an embedding space: the frozen encoder's ``encode`` and the trained decoder's generation, and
a probe run's folder loaded again as one (:func:`load_probe`).

Teacher forcing (see :mod:`memlab.space`): ``decoder_inputs`` puts the start
token (BOS, else CLS, EOS or pad) before the text and drops its last token;
labels are the text, ``-100`` on padding. A decoder trained with blank inputs
(``inputs="blank"``) ignores the input ids and generates all positions at once. ``decode_logits`` returns exact
log-probabilities over the tokenizer's full vocabulary.

A decoder with its own tokenizer (``decoder=pretrained:NAME``) rebuilds text in that tokenizer
(``target_tokenizer``): ``generate`` decodes with it, and ``decode_logits`` and ``decoder_inputs`` are over its
vocabulary; ``encode`` and ``encode_text`` stay in the encoder's.
"""

from __future__ import annotations

import json
from pathlib import Path
import torch

from memlab.decoding import beam_search_recompute, top_p_filter
from memlab.errors import ModelError
from memlab.probes.chunks.batch import shift_right
from memlab.probes.decoder.build import _own, load_decoder, save_decoder
from memlab.probes.decoder.model import ProbeDecoder
from memlab.probes.encoders.capture import right_pad
from memlab.probes.encoders.sources import load_encoder, load_tokenizer
from memlab.probes.parts import encoder_kind, get_part, reads_tokens, takes
from memlab.probes.readings import reconstruct_ids
from memlab.probes.report.recorded import check_recorded
from memlab.rundir import write_atomic


class FittedProbe:
    """Frozen encoder + trained probe decoder, usable wherever an EmbeddingSpace is."""

    def __init__(self, encoder, decoder: ProbeDecoder, target_tokenizer=None):
        if decoder.config.embed_dim != encoder.dim:
            raise ModelError(f"the decoder reads embeddings of width {decoder.config.embed_dim}, "
                             f"the encoder gives {encoder.dim}")
        self.encoder = encoder
        self.decoder = decoder.eval()
        self.tokenizer = encoder.tokenizer
        self.target_tokenizer = target_tokenizer if target_tokenizer is not None else encoder.tokenizer
        self.dim = int(encoder.dim)
        self.max_length = int(decoder.config.max_len)  # the most tokens its decoder rebuilds (target tokenizer)
        self.input_max_length = getattr(encoder, "max_length", None)  # the most its encoder reads (its tokenizer)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder.encode(input_ids, attention_mask)  # (B, D)

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(sentences), add_special_tokens=False, padding=True, return_tensors="pt")
        return self.encode(enc["input_ids"], enc["attention_mask"])

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        ids, mask = right_pad(input_ids, attention_mask)
        if ids.shape[1] > self.max_length:
            raise ModelError(f"{ids.shape[1]} tokens are more than this probe's decoder rebuilds ({self.max_length})")
        labels = ids.masked_fill(mask == 0, -100)  # (B, T)
        return shift_right(ids, int(self.decoder.config.start_id)), labels

    def _check(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 2 or z.shape[-1] != self.decoder.config.embed_dim:
            raise ModelError(f"embeddings of shape {tuple(z.shape)} do not fit this probe's decoder "
                             f"(width {self.decoder.config.embed_dim})")
        return z

    def decode_logits(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(self._check(z), decoder_input_ids)  # (B, T, C)
        return self.decoder.full_log_probs(logits)  # (B, T, V)

    @torch.no_grad()
    def generate(self, z: torch.Tensor, max_new_tokens: int = 64, num_beams: int = 1, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None) -> list[str]:
        """Greedy (default), sampling (``do_sample``, ``temperature``, ``top_p``) or beam search (``num_beams``)."""
        z = self._check(z)
        steps = min(max_new_tokens, self.max_length)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        parallel = not reads_tokens(self.decoder.config)  # the inputs hold no true token: all positions at once
        if not do_sample and (num_beams <= 1 or parallel):

            seq = reconstruct_ids(self.decoder, z, steps)  # (B, T): the greedy reconstruction the report scores
            return self.target_tokenizer.batch_decode(seq.tolist(), skip_special_tokens=True)
        b = z.shape[0]
        start = int(self.decoder.config.start_id)
        if parallel:  # every position is sampled at once from z alone
            logits = self.decoder(z, torch.full((b, steps), start, dtype=torch.long))  # (B, T, C)
            logp = self.decoder.full_log_probs(logits) / max(temperature, 1e-6)  # (B, T, V)
            probs = top_p_filter(torch.softmax(logp, -1).flatten(0, 1), top_p)  # (B*T, V)
            seq = torch.multinomial(probs, 1, generator=gen).view(b, steps)  # (B, T)
            return self.target_tokenizer.batch_decode(seq.tolist(), skip_special_tokens=True)
        if num_beams > 1:
            return self._beam(z, steps, num_beams)
        seq = torch.full((b, 1), start, dtype=torch.long)  # (B, 1)
        for _ in range(steps):
            logp = self.decoder.full_log_probs(self.decoder(z, seq)[:, -1:])[:, 0] / max(temperature, 1e-6)  # (B, V)
            nxt = torch.multinomial(top_p_filter(torch.softmax(logp, -1), top_p), 1, generator=gen)  # (B, 1)
            seq = torch.cat([seq, nxt], dim=1)
        return self.target_tokenizer.batch_decode(seq[:, 1:].tolist(), skip_special_tokens=True)

    def _beam(self, z: torch.Tensor, steps: int, k: int) -> list[str]:
        """Beam search (:func:`memlab.decoding.beam_search`) over hypotheses of ``steps`` tokens each: the decoder
        rebuilds a chunk of fixed length, so no token ends one early (``eos_id=-1``)."""

        def last_log_probs(zk: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
            return self.decoder.full_log_probs(self.decoder(zk, seq)[:, -1:])  # (B*k, 1, V)

        rows = beam_search_recompute(last_log_probs, z, int(self.decoder.config.start_id), -1, steps, k,
                                     log_probs=True)
        return self.target_tokenizer.batch_decode(rows, skip_special_tokens=True)

    def save(self, out_dir: str | Path, encoder_spec: dict) -> None:
        """Write ``decoder/`` (save_pretrained) and ``probe.json`` (how to rebuild the encoder)."""
        out = Path(out_dir)  # each file whole: a kill while writing leaves no empty or half file
        save_decoder(self.decoder, out / "decoder")
        write_atomic(out / "probe.json", json.dumps(encoder_spec, indent=2))


def load_probe(path: str | Path | None = None, **_) -> FittedProbe:
    """Reload a fitted probe from its run directory (``memlab probe --out DIR``): the encoder from ``probe.json``
    (its kind's and pooling's own options included), the decoder by the part that made it (:func:`load_decoder`)."""

    if path is None:
        raise ModelError("the 'probe' space needs the run directory of a fitted probe")
    p = Path(path)
    if not (p / "probe.json").is_file() or not (p / "decoder" / "config.json").is_file():
        raise ModelError(f"{p}: not a probe run directory (probe.json and decoder/ expected)")
    check_recorded(p, "the probe run")  # its files agree about how it was made, or one line
    spec = json.loads((p / "probe.json").read_text())
    saved = spec.get("part_options") or {}
    kw = {}
    kind = encoder_kind(spec["model"])
    if kind is not None and saved and takes(kind.impl.load, "options"):
        kw["options"] = _own(kind, saved)
    encoder = load_encoder(spec["model"], layer=spec.get("layer", -1), pool=spec.get("pool"),
                           final_norm=spec.get("final_norm", False), random_init=spec.get("random_init", False),
                           special_tokens=spec.get("special_tokens", True), dtype=spec.get("dtype", "float32"),
                           max_len=spec.get("max_len"), **kw)
    if spec.get("pool") and saved and hasattr(encoder, "pool_options"):
        encoder.pool_options = _own(get_part("pool", spec["pool"]), saved)
    decoder, target_tokenizer = load_decoder(p / "decoder")
    if target_tokenizer is None and spec.get("target_tokenizer"):  # a scratch decoder's targets in a named tokenizer

        target_tokenizer = load_tokenizer(spec["target_tokenizer"])
    return FittedProbe(encoder, decoder, target_tokenizer)
