"""A probe decoder part from an installed package of its own (``memlab-probe-rnn``, found through its
``memlab.plugins`` entry point; tests/app/test_run_read_again.py installs it into a temporary folder): a plain RNN
whose first state is a map of the embedding, with one option of its own, registered by one ``register_part`` call,
as the plugin guide's example is.

It honours one generic decoder setting, contained_lr, and none of the others (conditioning, inputs, bag head, decoder selection, ...): the probe switches
the bag head and its selection off for it, and a run of it read again (``memlab invert --probe RUN``) must not
hand those switched-off settings back as if the user had set them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from memlab.probes.decoder import CompactVocab, EmbeddingNorm
from memlab.probes.parts import Part, register_part


@dataclass
class RnnOptions:
    """decoder=rnn."""

    rnn_width: int = 16
    """Width of the RNN's state."""


class RnnDecoder(CompactVocab, EmbeddingNorm, nn.Module):
    """A one-layer tanh RNN whose first state is a map of the standardised embedding."""

    def __init__(self, config, options: RnnOptions = RnnOptions()):
        super().__init__()
        self.config = config
        n_classes = self._init_vocab(config.kept_ids, config.start_id, config.vocab_size)
        self.embed = nn.Embedding(self.num_kept + 1, options.rnn_width)
        self.rnn = nn.RNN(options.rnn_width, options.rnn_width, batch_first=True)
        self.head = nn.Linear(options.rnn_width, n_classes)
        self.start = nn.Linear(config.embed_dim, options.rnn_width)  # the embedding's pathway
        self._init_norm(config.embed_dim)

    def embedding_weights(self) -> list[str]:
        return ["start.weight"]

    def forward(self, z: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        ids = self.to_compact[decoder_input_ids.clamp(0, self.config.vocab_size)]  # (B, T)
        h0 = torch.tanh(self.start(self.standardise(z, self.start.weight.dtype)))[None]  # (1, B, H)
        out, _ = self.rnn(self.embed(ids), h0)  # (B, T, H)
        return self.head(out)  # (B, T, C)


register_part("decoder", Part("rnn", RnnDecoder, options=RnnOptions, honours=("contained_lr",),
                              description="a plain RNN started from the embedding (an installed test plugin)"))
