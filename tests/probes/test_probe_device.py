"""The probe needs no device flags: ``device: auto`` takes the best device present; a missing one is one line."""

from __future__ import annotations

import pytest
import torch

from conftest import one_line_error
from memlab.app.cli import main
from memlab.devices import best_device, pretend
from memlab.probes.encoders.sources import resolve_dtype
from memlab.probes.options import ProbeOptions, load_options


def test_auto_device_is_the_best_present_and_recorded_as_such():
    opts = load_options(None, [])
    assert ProbeOptions.device == "auto" and opts.device == str(best_device())
    assert load_options(None, ["device=cpu"]).device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["probe", "--model", "synthetic:concat", "--device", "cuda", "--out", str(out)]) == 2
    assert "no CUDA GPU" in one_line_error(capsys) and not out.exists()


def test_auto_dtype_is_float32_where_bf16_is_not_native():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    with pretend():  # the hardware's own reading, whatever MEMLAB_ACCEL forces
        assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
        if not torch.cuda.is_available():
            # no GPU: a cuda device never reads as native bf16 (no emulation)
            assert resolve_dtype("auto", "cuda") == torch.float32
    assert resolve_dtype("float16", "cpu") == torch.float16
