"""scripts/gpu_check.sh on a machine without a GPU: one clear line and exit 2; its plan covers every toy config;
its CPU tiny mode runs a check end to end. And ``--device`` of memlab generate / eval."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@no_gpu
def test_without_a_gpu_the_script_says_so_and_exits_2():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                       env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no CUDA GPU is visible" in lines[0], r.stderr
    assert r.stdout == ""


def test_plan_covers_every_toy_config_and_each_part(capsys, tmp_path):
    gc = _script()
    assert gc.main(["--device", "cpu", "--dry-run", "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out.splitlines()
    toys = sorted(p for p in ROOT.glob("configs/*/*toy*.yaml") if p.parent.name != "probes")
    assert len(toys) >= 5
    for cfg in toys:
        assert any(str(cfg) in line for line in out), cfg
    assert {line.split()[0] for line in out} == set(gc.PARTS)
    sonar = next(line for line in out if line.startswith("sonar "))
    assert "options.space=sonar:toy,preset=basic" in sonar and "model.preset=base" in sonar
    trains = [line for line in out if " memlab train " in line]
    assert trains and all("train.mixed_precision=bf16" in x and "train.cpu=true" in x for x in trains)
    quick = next(line for line in out if line.startswith("quickstart "))
    smol = next(line for line in out if line.startswith("smollm2 "))
    assert "memlab quickstart --out" in quick and "memlab probe --model smollm2 --out" in smol
    for flagless in (quick, smol):  # what a new user types: no device flag, no sizes outside --tiny
        assert "--device" not in flagless and "cpu" not in flagless.split("memlab", 1)[1], flagless
    assert "--fast" not in quick and "n_train=" not in smol
    assert not (tmp_path / "w").exists()  # a dry run writes nothing
    assert gc.main(["--device", "cpu", "--tiny", "--dry-run", "--out", str(tmp_path / "w")]) == 0
    tiny = capsys.readouterr().out.splitlines()
    quick = next(line for line in tiny if line.startswith("quickstart "))
    smol = next(line for line in tiny if line.startswith("smollm2 "))
    assert "--fast --only " + " ".join(gc.QUICKSTART_TINY) in quick and "n_train=" in smol and "epochs=1" in smol
    # the CPU plan is the CUDA plan with only the device changed
    cuda = _plan_for(gc, "cuda", tmp_path / "w")
    cpu = _plan_for(gc, "cpu", tmp_path / "w")
    assert [(p, n) for p, n, _ in cuda] == [(p, n) for p, n, _ in cpu]
    for (_, _, a), (_, _, b) in zip(cuda, cpu):
        assert [x for x in b if x not in a] in ([], ["train.cpu=true"], ["cpu"]), (a, b)
        assert [x for x in a if x not in b] in ([], ["cuda"]), (a, b)
    assert gc.main(["--device", "cpu", "--only", "toy,gpu"]) == 2
    assert "unknown part(s) gpu" in capsys.readouterr().err


def _plan_for(gc, device: str, out):
    """The script's plan for ``device`` at full sizes, without checking the machine."""
    args = type("Args", (), {"out": str(out), "tiny": False, "steps": 30, "device": device, "only": list(gc.PARTS)})()
    return gc.plan(args)


def test_the_1b_llama_shape_is_about_a_billion_parameters():
    import transformers as tf

    gc = _script()
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=4096, **gc.LLAMA_1B))
    assert 0.9e9 < sum(p.numel() for p in model.parameters()) < 1.1e9


def test_tiny_probe_check_runs_on_the_cpu(tmp_path, capsys):
    gc = _script()
    assert gc.main(["--device", "cpu", "--tiny", "--only", "probe", "--out", str(tmp_path / "w")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("probe ") and "peak_mem=" in x)
    assert line.endswith(" ok") and "tokens/s=n/a" not in line and "mfu=n/a" not in line
    assert (tmp_path / "w" / "probe" / "report.json").is_file()


def test_tiny_invert_check_runs_on_the_cpu(tmp_path, capsys):
    """The inversion's check builds its model when the probe's did not, places it by --device-map auto and
    certifies every token."""
    gc = _script()
    assert gc.main(["--device", "cpu", "--tiny", "--only", "invert", "--out", str(tmp_path / "w")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("invert ") and "peak_mem=" in x)
    assert "% of the vocabulary verified per token) " not in line and " ok (" in line, line
    rep = json.loads((tmp_path / "w" / "invert" / "report.json").read_text())
    assert rep["totals"]["certified"]["value"] == 1.0 and rep["totals"]["exact_match"]["value"] == 1.0
    assert json.loads((tmp_path / "w" / "invert" / "invert.json").read_text())["options"]["model"]["device_map"] \
        == "auto"


@pytest.mark.slow
def test_tiny_mode_runs_every_check_on_the_cpu(tmp_path, capsys):
    gc = _script()
    assert gc.main(["--device", "cpu", "--tiny", "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    from memlab.assets import is_installed

    # every toy config, sonar, probe, quickstart; ddp where no GPU is visible; smollm2 where it is installed
    # the probe at its defaults on one device, and on two processes where no GPU is visible; the inversion
    expected = len(gc.toy_configs()) + 5 + 2 * (not torch.cuda.is_available()) + is_installed("smollm2")
    assert "FAILED" not in out and out.count(" ok") == expected, out


def test_the_flagless_checks_name_a_model_that_ran_off_the_device():
    gc = _script()
    cpu, meta = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta")
    with gc.forwards_by_device() as seen:
        cpu(torch.ones(1, 2))
    gc.check_forwards(seen, "cpu")
    with pytest.raises(RuntimeError, match="no model ran on cuda"):
        gc.check_forwards(seen, "cuda")
    with gc.forwards_by_device() as seen:
        cpu(torch.ones(1, 2))
        meta(torch.ones(1, 2, device="meta"))
        meta(torch.ones(1, 2, device="meta"))
    with pytest.raises(RuntimeError, match="models ran off cpu: 2 forward calls on meta"):
        gc.check_forwards(seen, "cpu")
    cpu(torch.ones(1, 2))  # the hook is gone after the block
    assert seen == {"cpu": 1, "meta": 2}


def test_a_report_must_name_the_checked_device(tmp_path):
    gc = _script()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text('{"options": {"device": "cuda:0"}}')
    gc.check_device([tmp_path / "a" / "report.json"], "cuda")
    with pytest.raises(RuntimeError, match="a ran on cuda:0, not on cpu"):
        gc.check_device([tmp_path / "a" / "report.json"], "cpu")
    with pytest.raises(RuntimeError, match="no report.json"):
        gc.check_device([], "cpu")


def test_sonar_toy_presets_are_checked():
    from memlab.errors import ModelError
    from memlab.space import build_space

    assert build_space("sonar:toy,preset=toy").model.config.d_model == 64
    with pytest.raises(ModelError, match="unknown SONAR preset 'huge'"):
        build_space("sonar:toy,preset=huge")


# ------------------------------------------------------------------ --device of generate and eval


@no_gpu
@pytest.mark.parametrize("verb", [["generate", "--prompt", "Hello"], ["eval", "--task", "hellaswag"]])
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(verb, tmp_path, capsys):
    from memlab.app.cli import main

    out = tmp_path / "eval-out"
    extra = ["--out", str(out)] if verb[0] == "eval" else []
    assert main([verb[0], "--run", str(tmp_path / "no-such-run"), *verb[1:], *extra, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memlab: error: --device cuda: no CUDA GPU"), err
    assert not out.exists()  # refused before anything is loaded or written


def test_device_names_are_checked(capsys):
    from memlab.devices import resolve_device
    from memlab.errors import MemlabError

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cuda", "mps", "cpu")
    with pytest.raises(MemlabError, match="not a device"):
        resolve_device("gpu0")


def test_models_loaded_inside_running_on_go_to_its_device(tmp_path):
    """The meta device stands in for a GPU: a saved model loaded inside running_on lands there, outside it does not."""
    from memlab.devices import running_on
    from memlab.loading import load_pretrained
    from memlab.registry import FAMILIES

    FAMILIES.get("token_lm").make_model("toy").save_pretrained(str(tmp_path / "m"))
    with running_on(torch.device("meta")):
        inside = load_pretrained(tmp_path / "m")
    outside = load_pretrained(tmp_path / "m")
    assert next(inside.parameters()).device.type == "meta"
    assert next(outside.parameters()).device.type == "cpu"


def test_generate_on_the_cpu_device(tmp_path, capsys):
    from memlab.app.cli import main

    run = ROOT / "memlab" / "resources" / "checkpoints" / "token_lm-toy"
    assert main(["generate", "--run", str(run), "--prompt", "It is a truth", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("It is a truth")
