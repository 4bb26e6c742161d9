"""Stage 2, states: the frozen encoder a probe reads (a hub name, folder, shortcut, space or synthetic encoder),
its hidden states captured at a layer and pooled, its placement on the devices, and the encoder pass shared out
over the processes of a launch.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "capture": ("ARCHITECTURES", "backbone", "find_layers", "hook_plan", "right_pad", "special_affixes",
                "wrap_special", "model_max_positions", "HiddenStateEncoder", "SpaceEncoder"),
    "encode": ("ENCODER_SIDE", "encoder_spec", "encoder_options", "encode_all", "content_hash", "cached_encode",
               "encode_data"),
    "placement": ("DEVICE_MAPS", "FIT_SHARE", "UNITS", "Placement", "parse_size", "parse_max_memory", "check",
                  "weights_bytes", "free_bytes", "plan", "dispatch", "is_placed", "main_device", "module_device",
                  "describe"),
    "pooling": ("pool_states", "pool_last", "pool_second_last", "pool_mean", "pool_first"),
    "shards": ("is_main", "check_launch", "start", "encode_sharded", "cached_sharded"),
    "sources": ("TOKENIZER_FILES", "load_space", "resolve_dtype", "shortcut_source", "path_source", "hub_source",
                "resolve_source", "load_tokenizer", "load_encoder", "load_transformers", "HUB", "FOLDER", "SHORTCUT",
                "SPACE"),
    "synthetic": ("KINDS", "DEFAULT_TOKENIZER", "SyntheticEncoder", "load_synthetic_kind", "load_synthetic", "KIND",
                  "EXPECT", "ALIGN_SLACK", "check_align", "check_synthetic_spec", "check_synthetic", "calibrate_on",
                  "calibration"),
})
