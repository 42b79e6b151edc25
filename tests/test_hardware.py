"""training/hardware.py: what a run chooses on the GPUs users have, simulated on the CPU (no GPU here), and the
float16 + GradScaler path those GPUs without bf16 take."""
import json
import re
import shutil

import pytest
import torch

from training.config import ConfigError
from training.hardware import Platform, choose_compile, choose_precision, compile_blocker, detect

H100 = Platform("cuda", "NVIDIA H100 80GB HBM3", (9, 0), True, "3.4.0", True)
V100 = Platform("cuda", "Tesla V100-SXM2-32GB", (7, 0), False, "3.4.0", True)
P100 = Platform("cuda", "Tesla P100-PCIE-16GB", (6, 0), False, "3.4.0", True)
NO_TRITON = Platform("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), True, None, True)  # e.g. Windows with a CUDA torch
MAC = Platform("mps", "mps", None, False, None, True)
NO_DYNAMO = Platform("cuda", "NVIDIA L40S", (8, 9), True, "3.4.0", False)  # dynamo unsupported on this Python


def test_precision_auto():
    assert choose_precision("auto", H100) == ("bfloat16", "auto: bfloat16 autocast, NVIDIA H100 80GB HBM3 (sm_90) has bf16")
    precision, why = choose_precision("auto", V100)
    assert precision == "float16" and why == ("auto: float16 autocast + GradScaler, Tesla V100-SXM2-32GB (sm_70) has "
                                              "no bf16; --dtype float32 for no loss scaling")
    assert choose_precision("auto", MAC)[0] == choose_precision("auto", detect("cpu"))[0] == "float32"


def test_precision_asked():
    assert choose_precision("float32", V100) == ("float32", "--dtype float32")
    assert choose_precision("float16", H100) == ("float16", "--dtype float16 (autocast + GradScaler)")
    assert choose_precision("bfloat16", detect("cpu"))[0] == "bfloat16"
    with pytest.raises(ConfigError, match=r"--dtype bfloat16: Tesla V100-SXM2-32GB \(sm_70\) has no bf16; use --dtype "
                                          "float16 .* or --dtype float32"):
        choose_precision("bfloat16", V100)
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'; choose auto, bfloat16, float16, float32"):
        choose_precision("fp8", H100)
    with pytest.raises(ConfigError, match="float16 needs a CUDA or CPU device"):
        choose_precision("float16", MAC)


def test_compile_auto():
    assert choose_compile(None, H100) == (True, "auto: torch.compile, NVIDIA H100 80GB HBM3 (sm_90), Triton 3.4.0")
    assert choose_compile(None, V100)[0] is True  # sm_70 is Triton's oldest target
    assert choose_compile(None, P100) == (False, "auto: eager PyTorch, Tesla P100-PCIE-16GB is sm_60; Triton needs "
                                                 "compute capability 7.0 or newer")
    assert choose_compile(None, NO_TRITON) == (False, "auto: eager PyTorch, Triton is not installed (inductor "
                                                      "generates Triton code on CUDA)")
    assert choose_compile(None, NO_DYNAMO)[0] is False and "does not support this Python" in choose_compile(None, NO_DYNAMO)[1]
    assert choose_compile(None, MAC) == (False, "auto: eager on mps (--compile to compile anyway)")


def test_compile_asked():
    assert choose_compile(False, H100) == (False, "--no-compile")
    assert choose_compile(True, detect("cpu")) == (True, "--compile")  # inductor's C++ backend, no Triton needed
    for platform in (P100, NO_TRITON, NO_DYNAMO):
        with pytest.raises(ConfigError, match=re.escape(f"--compile: {compile_blocker(platform)}; use --no-compile")):
            choose_compile(True, platform)


def test_kernels_follow_the_platform():
    """The activation kernels take the same hardware limits (activations/selfcheck.py), read from the platform
    described, whether or not this machine has Triton."""
    from activations import impl, selfcheck
    assert "compute capability 7.0" in selfcheck.blocker(P100)
    assert selfcheck.blocker(MAC) == "not a CUDA device (mps)"
    assert selfcheck.blocker(NO_TRITON) == "Triton is not installed"
    if impl.kernels is not None:
        assert selfcheck.blocker(H100) is None and selfcheck.blocker(V100) is None


def test_float16_run_uses_a_grad_scaler_and_resumes_it(tmp_path):
    """--dtype float16 (what a V100 gets by default), here on the CPU: the loss scaled, gradients unscaled before
    clipping, the scaler's state in checkpoints and restored on resume, the decision in run.json."""
    from test_train_gpt2 import args, train_in_process, train_losses, write_corpus
    from training.checkpoint import load_checkpoint

    data = write_corpus(tmp_path / "data")
    full = args(data, tmp_path / "full", dtype="float16", max_steps=8)
    train_in_process(full)
    shutil.copytree(tmp_path / "full", tmp_path / "half", ignore=shutil.ignore_patterns("*00008*"))
    train_in_process(args(data, tmp_path / "half", dtype="float16", max_steps=8, resume="true"))
    losses, val = train_losses(tmp_path / "full")
    assert losses[-1] < losses[0] - 0.3 and all(v == v for v in val)
    assert train_losses(tmp_path / "half") == (losses, val)
    for run in ("full", "half"):  # 8 steps without overflow since the scaler's start: restored on resume
        scaler = load_checkpoint(tmp_path / run / "model_00008.pt")["scaler"]
        assert scaler["scale"] == 2.0 ** 16 and scaler["_growth_tracker"] == 8, run
    decisions = json.loads((tmp_path / "full" / "run.json").read_text())["environment"]["decisions"]
    assert decisions["precision"] == {"value": "float16", "reason": "--dtype float16 (autocast + GradScaler)"}


def test_clip_sees_unscaled_gradients(monkeypatch):
    """The norm a float16 run logs and clips is the true one: unscale_ comes before clip_grad_norm_."""
    from training.precision import grad_scaler
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = grad_scaler("cpu", "float16")
    loss = model(torch.ones(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.testing.assert_close(model.weight.grad, torch.full((1, 4), 2.0))
    assert not grad_scaler("cpu", "float32").is_enabled()
