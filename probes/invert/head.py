"""A causal model's own output embeddings, read from its checkpoint when they are not tied to the input table.

memlab loads the base model (its blocks and input embeddings; a task head it does not read is left in the file),
so a model whose output embeddings are its own (Llama 3, Mistral, a GGUF that stores ``output.weight``) has no
head to give the per-position search its prior. :func:`output_embeddings` reads just that matrix, from the
model's safetensors files (``lm_head.weight`` and the names other families give it) or from its GGUF file
(``output.weight``, dequantized with the ``gguf`` package), and nothing else. Local files only: a hub name that is
not in a local folder gives None.
"""

from __future__ import annotations

from pathlib import Path

import torch

HEAD_KEYS = ("lm_head.weight", "model.lm_head.weight", "embed_out.weight", "output.weight")
"""Where causal families keep their output embeddings in a safetensors checkpoint."""


def output_embeddings(spec: str, vocab_size: int | None = None) -> torch.Tensor | None:
    """The output embeddings ``(V, D)`` (float32) of the model ``spec`` names (a shortcut, folder, run or GGUF
    file), their first ``vocab_size`` rows; None where the checkpoint holds none (tied, or not local)."""
    from memlab.probes.encoders.sources import resolve_source

    folder, gguf_file, _ = resolve_source(spec)
    w = _from_gguf(Path(folder) / gguf_file) if gguf_file else _from_folder(Path(folder))
    if w is None:
        return None
    return w[:vocab_size] if vocab_size is not None else w


def own_head(spec: str, reader) -> torch.Tensor | None:
    """The output embeddings of ``spec``'s model for the prior where they are its own: None where they are tied to
    the input table that ``reader`` (a :class:`~memlab.probes.invert.layer.LayerReader`) holds, or not local."""
    from memlab.probes.invert.positions.rank import NextTokenHead

    return None if NextTokenHead.tied(reader) else output_embeddings(spec, reader.vocab_size)


def _from_folder(folder: Path) -> torch.Tensor | None:
    from safetensors import safe_open

    from memlab.loading import safetensors_files

    for f in safetensors_files(folder):  # empty for a hub name or .bin weights
        with safe_open(str(f), framework="pt") as st:
            keys = set(st.keys())
            for key in HEAD_KEYS:
                if key in keys:
                    return st.get_tensor(key).float()
    return None


def _from_gguf(path: Path) -> torch.Tensor | None:
    import gguf

    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        if t.name == "output.weight":
            w = gguf.quants.dequantize(t.data, t.tensor_type)  # (V, D) float32
            return torch.from_numpy(w.reshape(int(t.shape[-1]), int(t.shape[0])).copy()).float()
    return None
