"""--device and --threads of every verb that takes them: a device this machine lacks, a name that is no device and
a thread count below 1 are one line on stderr, exit 2, and no output folder; bench records the device it ran on
and finds its MFU configs from any working folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memlab.app.cli import main
from memlab.devices import best_device

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "memlab" / "resources" / "checkpoints" / "token_lm-toy"

_mps = getattr(torch.backends, "mps", None)
HAS_MPS = _mps is not None and _mps.is_available()


def _verbs(out: Path) -> dict[str, list[str]]:
    """Each verb that takes --device, up to its device value; the ones with an output folder write into ``out``."""
    return {
        "generate": ["generate", "--run", str(RUN), "--prompt", "It is a truth", "--max-new-tokens", "2", "--device"],
        "eval": ["eval", "--run", str(RUN), "--task", "hellaswag", "--limit", "2", "--out", str(out), "--device"],
        "probe": ["probe", "--model", "synthetic:concat", "--out", str(out), "n_train=8", "n_eval=4", "--device"],
        "bench-flops": ["bench", "--parts", "flops", "--quick", "--out", str(out), "--device"],
        "bench-prefill": ["bench", "--parts", "prefill", "--quick", "--out", str(out), "--device"],
    }


def _refused(argv: list[str], out: Path, capsys, *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error: "), err
    assert all(w in err[0] for w in words), err[0]
    assert not out.exists()  # refused before anything was written
    return err[0]


MISSING = [pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")),
           pytest.param("cuda:1", marks=pytest.mark.skipif(torch.cuda.device_count() > 1, reason="2 GPUs are present")),
           pytest.param("mps", marks=pytest.mark.skipif(HAS_MPS, reason="MPS is present"))]


@pytest.mark.parametrize("device", MISSING)
@pytest.mark.parametrize("verb", ["generate", "eval", "probe", "bench-flops", "bench-prefill"])
def test_a_missing_device_is_one_line(verb, device, tmp_path, capsys):
    out = tmp_path / "out"
    _refused([*_verbs(out)[verb], device], out, capsys, f"--device {device}:")


@pytest.mark.parametrize("verb", ["generate", "eval", "probe", "bench-flops"])
def test_a_name_that_is_no_device_is_one_line(verb, tmp_path, capsys):
    out = tmp_path / "out"
    _refused([*_verbs(out)[verb], "gpu0"], out, capsys, "--device gpu0: not a device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_quickstart_passes_a_missing_device_to_its_probes_and_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    _refused(["quickstart", "--fast", "--only", "synthetic:concat", "--out", str(out), "--set", "device=cuda"], out,
             capsys, "--device cuda:")


@pytest.mark.parametrize("threads", ["0", "-3"])
@pytest.mark.parametrize("verb", ["probe", "quickstart"])
def test_threads_below_one_are_one_line(verb, threads, tmp_path, capsys):
    out = tmp_path / "out"
    argv = {"probe": ["probe", "--model", "synthetic:concat", "n_train=8", "n_eval=4"],
            "quickstart": ["quickstart", "--fast", "--only", "synthetic:concat"]}[verb]
    before = torch.get_num_threads()
    _refused([*argv, "--out", str(out), "--threads", threads], out, capsys, "--threads", threads)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("argv", [["probe", "--model", "synthetic:concat", "threads=0"],
                                  ["quickstart", "--fast", "--only", "synthetic:concat", "--set", "threads=0"]])
def test_threads_below_one_as_an_option_are_one_line(argv, tmp_path, capsys):
    out = tmp_path / "out"
    _refused([*argv, "--out", str(out)], out, capsys, "'threads' must be >= 1")


@pytest.mark.parametrize("device", [None, "cpu"])
def test_bench_records_the_device_it_ran_on(device, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", "--parts", "flops", "--out", str(out), *(["--device", device] if device else [])]) == 0
    res = json.loads((out / "bench.json").read_text())
    ran = torch.device(device) if device else best_device()
    assert res["device"] == str(ran)
    assert res["device_name"] == (torch.cuda.get_device_name(ran) if ran.type == "cuda" else ran.type)
    assert f"Device: {ran}" in (out / "README.md").read_text()


def test_bench_mfu_finds_the_shipped_configs_from_any_folder(tmp_path, monkeypatch):
    from memlab.app.bench.mfu import DEFAULT_CONFIGS, FALLBACK_CONFIGS, config_path
    from memlab.paths import configs_dir

    monkeypatch.chdir(tmp_path)  # outside the clone: no configs/ here
    for name in [*DEFAULT_CONFIGS.values(), *FALLBACK_CONFIGS.values()]:
        assert not Path(name).exists()
        found = Path(config_path(name))
        assert found.is_file() and found.is_relative_to(configs_dir()), name
    (tmp_path / "configs" / "token_lm").mkdir(parents=True)
    (tmp_path / "configs" / "token_lm" / "small.yaml").write_text("name: mine\n")
    assert config_path("configs/token_lm/small.yaml") == "configs/token_lm/small.yaml"  # a file here is read first
    assert config_path("configs/token_lm/nope.yaml") == "configs/token_lm/nope.yaml"  # absent: named as given


def test_quickstart_encoders_run_where_their_probes_do(tmp_path, monkeypatch):
    """Each entry's encoder is loaded onto the device its probe resolved (a GPU machine's ``auto``), not the CPU."""
    from memlab.app import quickstart as qs
    from memlab.errors import MemlabError
    from memlab import devices

    monkeypatch.setattr(devices, "resolve_device", lambda name="auto": torch.device("meta"))  # a GPU's "auto"
    seen = []
    monkeypatch.setattr(qs, "load_encoder", lambda spec, **kw: seen.append(kw.get("device")) or
                        (_ for _ in ()).throw(MemlabError("stop after loading")))
    entry = qs.Entry("toy", "last token", qs._hf(lambda c: "unused", pool="last"))
    with pytest.raises(MemlabError, match="stop after loading"):
        qs.run_quickstart(out=str(tmp_path / "q"), fast=True, entries=[entry])
    assert seen == ["meta"]
    assert not (tmp_path / "q").exists()  # the failed quickstart removed its folder
