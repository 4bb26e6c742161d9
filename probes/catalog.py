"""The probe's own parts, registered by name (:mod:`memlab.probes.parts`): each part's options dataclass and what it
honours are here, its code is named as ``"module:attr"`` and imported the first time the part is used. Importing
this module (as :mod:`memlab.probes` does) imports neither torch nor transformers, so the probe's command line is
built from these registrations at once."""

from __future__ import annotations

from memlab.probes.parts import Part, register_part
from memlab.probes.sections import (AlignOptions, BowOptions, LlamaOptions, PrefixOptions, PretrainedOptions,
                                    TeacherOptions)

P = "memlab.probes"
"""The package whose modules hold the built-in parts' code."""

# encoder kinds: the first whose ``matches`` takes the spec, newest registration first; each loads its own kind.
# space and synthetic refuse random_init themselves, in one line that says why.
for _name, _code, _doc, _honours in [
    ("hub", "encoders.sources:HUB", "a Hugging Face hub name, read from the local cache", "all"),
    ("folder", "encoders.sources:FOLDER", "a save_pretrained folder, a memlab run directory or a GGUF file", "all"),
    ("shortcut", "encoders.sources:SHORTCUT", "a packaged model (memlab.assets: memlab-lm, minilm, smollm2)", "all"),
    ("space", "encoders.sources:SPACE", "space:NAME[:PATH]: any registered EmbeddingSpace", ("random_init",)),
    ("synthetic", "encoders.synthetic:KIND", "synthetic:concat|bag|constant: a calibration encoder", ("random_init",)),
]:
    register_part("encoder", Part(_name, f"{P}.{_code}", description=_doc, honours=_honours))

POOLINGS = {"last": "the last real token's state", "mean": "the mean over real tokens",
            "first": "the first position's state", "second_last": "the state before the last token"}
"""The built-in poolings (``pool`` parts, their code ``pool_NAME`` in :mod:`memlab.probes.encoders.pooling`) and what
each reads: the one list of them. ``memlab invert`` reads the same poolings (its pooled ``--states``,
:data:`memlab.probes.invert.options.POOLED`, and the pooled search's :data:`memlab.probes.invert.pooled.searcher.POOLS`
are this list), and a probe run's pooling names the ``--states`` that reads it."""

for _name, _doc in POOLINGS.items():
    register_part("pool", Part(_name, f"{P}.encoders.pooling:pool_{_name}", description=_doc))

register_part("conditioning", Part("unrolled", f"{P}.decoder.inputs:UNROLLED",
                                   description="projected to max_len vectors, one added to each position"))
register_part("conditioning", Part("prefix", f"{P}.decoder.inputs:PREFIX", options=PrefixOptions,
                                   description="projected to prefix_len memory vectors"))

register_part("inputs", Part("teacher", f"{P}.decoder.inputs:TEACHER", options=TeacherOptions,
                             description="the true previous tokens (greedy generation is autoregressive)"))
register_part("inputs", Part("blank", f"{P}.decoder.inputs:BLANK", description="the start token everywhere (a blank copy)"))

register_part("decoder", Part("llama", f"{P}.decoder.model:ProbeDecoder", options=LlamaOptions, honours="all",
                              description="a small Llama-style causal LM trained from scratch (memlab.probes.decoder)"))
register_part("decoder", Part(
    "pretrained", f"{P}.decoder.pretrained:KIND", options=PretrainedOptions, honours="all",
    argument="NAME: a causal LM, as a shortcut, folder, run, GGUF file or hub name",
    check=f"{P}.decoder.pretrained:check",
    description="a pretrained causal LM reading the embedding as soft prompts (frozen, LoRA or fine-tuned)"))

register_part("readout", Part(
    "bow", f"{P}.readouts.bow:bow_readout", options=BowOptions, summary=f"{P}.readouts.bow:bow_summary",
    gain_unit="of the bag of words over its prior",
    readings=(("recovered", "bag-of-words read-out", False, 3),
              ("gain", "bag-of-words read-out over its prior", True, 3)),
    columns=f"{P}.readouts.bow:bow_columns", member=f"{P}.readouts.bow:bow_member",
    description="bag-of-words read-out: a linear multi-label head, trained in the fit loop"))
register_part("readout", Part(
    "align", f"{P}.readouts.align:align_readout", options=AlignOptions, check_context=f"{P}.readouts.align:check_target",
    summary=f"{P}.readouts.align:align_summary", columns=f"{P}.readouts.align:align_columns",
    readings=(("bits_per_chunk", "alignment read-out, bits per chunk over its prior", True, 2),
              ("recovered", "alignment read-out, token accuracy in its target", False, 3),
              ("gain", "alignment read-out over its prior", True, 3),
              ("token_set_f1", "alignment read-out, TF1", False, 3),
              ("token_set_f1_gain", "alignment read-out, TF1 over its prior", True, 3)),
    description="alignment read-out: a ridge map into align_target's space, read by its own decoder"))

for _name, _doc in [("token_set_f1", "F1 of the token sets of reconstruction and chunk"),
                    ("sentence_bleu", "NLTK sentence BLEU of the decoded reconstruction"),
                    ("exact_match", "share of chunks rebuilt token for token")]:
    register_part("scorer", Part(_name, f"{P}.readings:score_{_name}", description=_doc))
