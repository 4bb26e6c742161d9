"""Stage 3, fit: the probe's decoder (the model, its conditionings and token inputs, a pretrained LM as a decoder),
built from the encoder's facts, saved and loaded again; the one fit loop and the fits it runs (probe, control,
the candidates), and the control cache.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "build": ("start_token_id", "LLAMA_SHAPE", "decoder_config", "build_decoder", "save_decoder"),
    "control_cache": ("FORMAT", "FOLDER", "DECODERS", "encode", "decode", "compute_side", "ControlCache"),
    "fit": ("evaluate", "information_gain", "Timer", "fit_decoders", "contain", "contained_shares", "fit_selected"),
    "fitloop": ("LOG_EVERY", "held_back_rows", "train_readouts", "train_members", "RACE_Z", "race_losers",
                "paired_se", "train_decoders", "train_decoder"),
    "fitted": ("FittedProbe", "load_probe"),
    "group": ("optimiser", "BATCHED", "autocast_context", "RandomStream", "member_nll", "chunk_nll",
              "clip_per_member", "DecoderGroup"),
    "inputs": ("UNROLLED", "PREFIX", "TEACHER", "BLANK"),
    "model": ("ATTENTION", "one_dtype_sdpa", "layer_norm", "ProbeDecoderConfig", "ProbeDecoderAPI", "CompactVocab",
              "EmbeddingNorm", "ProbeDecoder"),
    "pretrained": ("WEIGHTS", "LM_PREFIX", "PretrainedDecoderConfig", "load_lm", "load_decoder_tokenizer",
                   "fingerprint", "PretrainedDecoder", "build", "load_decoder", "check", "KIND"),
    "records": ("FitData", "ControlStore", "ControlEntry", "Fitted", "ControlRun", "DecoderFit", "Loop"),
})
