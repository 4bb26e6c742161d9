"""``memlab bench``: performance measured side by side in one run (ratios, not absolute times,
are the result on a shared machine). Parts: ``prefill`` (memory model vs full attention),
``generation`` (SONAR-LLM vs token LM), ``mfu`` (training MFU against a matmul timed in the
same run), ``probe`` (the inversion probe's time split), ``flops`` (the analytic model)."""

PARTS = ("flops", "prefill", "generation", "mfu", "probe")
"""Known parts, in run order (here, not in ``run``, so that the CLI reads them without importing torch)."""
