"""training/hardware.py: what a run chooses on the GPUs users have, simulated on the CPU (no GPU here), and the
float16 + GradScaler path those GPUs without bf16 take."""
import json
import re
import shutil
from dataclasses import replace

import pytest
import torch

from training.config import ConfigError
from training.hardware import (CudaStack, Platform, choose_compile, choose_precision, compile_blocker, cuda_mismatch,
                               detect, read_cuda_stack)

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
    if impl.loaded_kernels() is not None:
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


# The start-up check of the driver, torch's build and the GPU (training/hardware.py's check_cuda): stacks that
# cannot work together, as a cluster has them, each answered with one line naming the build to install.
H100_GPU, V100_GPU = ("NVIDIA H100 80GB HBM3", (9, 0)), ("Tesla V100-SXM2-32GB", (7, 0))
CU130_ARCH = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # torch 2.11's and 2.13's PyPI wheel


def test_a_cuda_13_wheel_on_a_550_driver_names_the_cuda_12_6_build():
    stack = CudaStack("2.13.0+cu130", (13, 0), (12, 4), (H100_GPU,))
    assert cuda_mismatch(stack) == (
        "torch 2.13.0+cu130 is built for CUDA 13.0, which this NVIDIA driver (CUDA 12.4 at most) cannot run: install "
        "torch's CUDA 12.6 build: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126")


def test_a_v100_with_a_wheel_without_sm_70_names_the_cuda_12_6_build():
    stack = CudaStack("2.11.0+cu130", (13, 0), (13, 0), (V100_GPU,), CU130_ARCH)
    assert cuda_mismatch(stack) == (
        "torch 2.11.0+cu130 has no code for the Tesla V100-SXM2-32GB (sm_70), only for sm_75 sm_80 sm_86 sm_90 "
        "sm_100 sm_120: install torch's CUDA 12.6 build: pip install torch==2.11.0 --index-url "
        "https://download.pytorch.org/whl/cu126")


def test_what_no_build_fits_names_the_driver_or_the_cpu():
    blackwell = ("NVIDIA RTX PRO 6000 Blackwell", (12, 0))  # only the CUDA 13.0 build has sm_120 code
    # a 570 driver runs CUDA 12.8, not 13.0
    assert cuda_mismatch(CudaStack("2.13.0+cu126", (12, 6), (12, 8), (blackwell,), ("sm_90",))).endswith(
        "update the NVIDIA driver to 580 or newer, then pip install torch==2.13.0 --index-url "
        "https://download.pytorch.org/whl/cu130")
    kepler = CudaStack("2.13.0+cu130", (13, 0), (12, 4), (("Tesla K80", (3, 7)),))
    assert cuda_mismatch(kepler).endswith("no CUDA build of torch 2.13.0 runs on Tesla K80 (sm_37): use --device cpu")
    assert cuda_mismatch(replace(kepler, torch_version="2.13.0+cpu", wheel_cuda=None)) is None  # the CPU build it needs
    cpu_build = CudaStack("2.13.0+cpu", None, (12, 4), (V100_GPU,))
    assert cuda_mismatch(cpu_build) == (
        "torch 2.13.0+cpu is not a CUDA build, and this machine has a Tesla V100-SXM2-32GB (sm_70) with a CUDA 12.4 "
        "driver: install torch's CUDA 12.6 build: pip install torch==2.13.0 --index-url "
        "https://download.pytorch.org/whl/cu126; or --device cpu")


def test_stacks_that_work_together_pass():
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 1), (H100_GPU,), CU130_ARCH)) is None
    assert cuda_mismatch(CudaStack("2.13.0+cu126", (12, 6), (12, 2), (V100_GPU,), ("sm_70", "sm_90"))) is None
    ada = ("NVIDIA L40S", (8, 9))  # sm_86 code runs on sm_89; PTX on anything as new
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 0), (ada,), ("sm_86",))) is None
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 0), (H100_GPU,), ("compute_80",))) is None
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 0), (H100_GPU,), ("sm_90a",))) is None
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 0), (ada,), ("sm_90a",))) is not None  # its GPU only
    assert cuda_mismatch(CudaStack("2.13.0+cu130", (13, 0), (13, 0), (H100_GPU,), ("sm_80",))) is not None  # own major
    assert cuda_mismatch(CudaStack("2.13.0+cpu")) is None  # no NVIDIA driver: a CPU machine
    assert cuda_mismatch(read_cuda_stack()) is None  # this machine (no GPU in CI; a GPU that works elsewhere)


def test_a_trainer_that_cannot_use_the_gpu_stops_in_one_line_before_building(tmp_path, monkeypatch):
    import train_gpt2
    from training import hardware

    stack = CudaStack("2.13.0+cu130", (13, 0), (12, 4), (H100_GPU,))
    monkeypatch.setattr(hardware, "read_cuda_stack", lambda: stack)
    with pytest.raises(SystemExit) as stopped:
        train_gpt2.main(["--out-dir", str(tmp_path / "out"), "--data-dir", str(tmp_path / "nowhere")])
    message = str(stopped.value)
    assert message.startswith("error: torch 2.13.0+cu130 is built for CUDA 13.0") and "\n" not in message
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" in message
    assert not (tmp_path / "out").exists()  # nothing built, nothing written
    hardware.check_cuda("cpu")  # a run asked onto the CPU is not checked
