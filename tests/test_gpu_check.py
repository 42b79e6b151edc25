"""bench/gpu_check.py on a machine without a GPU (CI): it runs what applies (every kernel against the PyTorch path,
in Triton's interpreter), lists what it skipped, writes its JSON and markdown, and exits 0."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the full command is the test: run it by hand")
def test_cpu_part_passes_and_lists_what_it_skipped(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # the script switches the interpreter on by itself when there is no GPU
    result = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    results = report["results"]
    assert results["kernels"]["status"] == "PASS"
    figures = results["kernels"]["figures"]
    assert len(figures) == 12 and set(figures.values()) == {"ok"}  # 6 kernel families x (bf16, fp32)
    skipped = [name for name, r in results.items() if r["status"] == "SKIP"]
    assert skipped == ["train_step", "loss_chunks", "attention", "resume", "hellaswag", "translation", "ddp"]
    assert report["environment"]["interpreted_kernels"] is True and report["environment"]["torch"] == torch.__version__
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| kernels | PASS |" in md and md.count("| SKIP |") == 7
    assert "train_step   SKIP  needs a CUDA GPU" in result.stdout


def test_a_failing_kernel_is_a_fail_and_exit_1(tmp_path, monkeypatch, capsys):
    """In process: a kernel that disagrees with PyTorch turns the check (and the exit code) to FAIL with the reason."""
    pytest.importorskip("triton")
    from activations import kernels
    from bench import gpu_check

    real = kernels.anact
    monkeypatch.setattr(kernels, "anact", lambda *a: real(*a) * 1.01)
    assert gpu_check.main(["--out", str(tmp_path), "--only", "kernels"]) == 1
    figures = json.loads((tmp_path / "gpu_check.json").read_text())["results"]["kernels"]["figures"]
    assert "differs from the PyTorch path" in figures["nswish float32"] and figures["aglu float32"] == "ok"
    assert "kernels      FAIL" in capsys.readouterr().out
