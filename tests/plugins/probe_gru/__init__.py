"""A probe decoder from a package outside memlab (tests/probes/test_probe_gru_plugin.py): a GRU that starts from the
embedding, with options of its own, registered by one ``register_part`` call. An installed package names this
module under the ``memlab.plugins`` entry-point group; the test stands a fake entry point in for the metadata.

It honours one generic decoder setting, contained_lr (it names its embedding pathway), and none of the others
(conditioning, inputs, bag head, decoder selection, ...): the
probe refuses them when they are set and switches the bag head and its selection off when they are not. memlab
saves it (``config.json`` and ``model.safetensors``) and rebuilds it from its config and options when the run is
loaded again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from memlab.probes.decoder import CompactVocab, EmbeddingNorm
from memlab.probes.parts import Part, register_part


@dataclass
class GruOptions:
    """decoder=gru."""

    hidden_size: int = 24
    """Width of the GRU's state (llama has an option of the same name, with its own default)."""
    gru_layers: int = 1
    """Stacked GRU layers."""


class GruDecoder(CompactVocab, EmbeddingNorm, nn.Module):
    """A GRU decoder whose first state is a map of the standardised embedding."""

    def __init__(self, config, options: GruOptions = GruOptions()):
        super().__init__()
        self.config = config
        n_classes = self._init_vocab(config.kept_ids, config.start_id, config.vocab_size)
        self.layers, self.width = options.gru_layers, options.hidden_size
        self.embed = nn.Embedding(self.num_kept + 1, options.hidden_size)
        self.gru = nn.GRU(options.hidden_size, options.hidden_size, num_layers=options.gru_layers, batch_first=True)
        self.head = nn.Linear(options.hidden_size, n_classes)
        self.start = nn.Linear(config.embed_dim, options.gru_layers * options.hidden_size)  # the embedding's pathway
        self._init_norm(config.embed_dim)

    def embedding_weights(self) -> list[str]:
        return ["start.weight"]

    def forward(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        ids = self.to_compact[decoder_input_ids.clamp(0, self.config.vocab_size)]  # (B, T)
        zn = self.standardise(z, self.start.weight.dtype)  # (B, D)
        h0 = torch.tanh(self.start(zn)).view(-1, self.layers, self.width).transpose(0, 1).contiguous()  # (L, B, H)
        out, _ = self.gru(self.embed(ids), h0)  # (B, T, H)
        return self.head(out)  # (B, T, C)


register_part("decoder", Part("gru", GruDecoder, options=GruOptions,
                              honours=("contained_lr",), description="a GRU started from the embedding (a test plugin)"))
