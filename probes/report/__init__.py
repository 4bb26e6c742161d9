"""Stage 5, report: the typed report of a probe (``report.json``) and what a recorded run is checked against.
"""

from memlab.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "plots": ("plot_accuracy_by_position", "plot_training"),
    "recorded": ("read_json", "resolved_layer", "ENCODER_RECORDS", "DECODER_RECORDS", "recorded_mismatch",
                 "check_recorded"),
    "report": ("DEFINITIONS", "LEGACY_READOUT", "SCHEMA_VERSION", "jsonable", "ReadoutResult", "CalibrationCheck",
               "Calibration", "Fit", "ProbeReport", "peak_memory_mb", "write_report", "calibration_lines", "READING_LINES", "reading_lines", "seen_line", "format_summary"),
})
