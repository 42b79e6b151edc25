"""activations/selfcheck.py: impl="auto" trusts a Triton kernel only after it matches the PyTorch path on the device,
keeps the faster correct path, and takes the same decision on every rank.

No GPU here: the kernels run in Triton's interpreter (tests/conftest.py), and the tests let "auto" consider
CPU tensors (impl.KERNEL_DEVICES), which a real run never does."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: the kernels cannot run")

import activations  # noqa: E402
from activations import impl, kernels, selfcheck  # noqa: E402
from training.hardware import Platform  # noqa: E402

if not kernels.INTERPRETED:
    pytest.skip("the kernels need Triton's interpreter here (tests/conftest.py sets TRITON_INTERPRET=1)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
CPU = Platform("cpu", "cpu", None, True, "3", True)
FAMILIES = ["aglu", "apa", "nswish", "nrelu", "nswish/per_instance", "nrelu/per_instance"]


@pytest.fixture
def auto_on_cpu(monkeypatch):
    """"auto" considers CPU tensors (the interpreter runs the kernels), with a fresh cache of checked families."""
    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(impl, "TRUSTED", {})


@pytest.fixture
def counted_aglu(monkeypatch):
    """(an impl="auto" AGLU, its impl="torch" twin, an input, the list of kernel calls)."""
    torch.manual_seed(0)
    auto, plain = activations.build("aglu"), activations.build("aglu", impl="torch")
    plain.load_state_dict(auto.state_dict())
    calls = []
    real = kernels.apa
    monkeypatch.setattr(kernels, "apa", lambda *a: calls.append(1) or real(*a))
    return auto, plain, torch.randn(4, 33), calls


def raising(*args, **kwargs):
    raise RuntimeError("ptxas fatal: simulated failure")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_family_passes_its_check(dtype):
    for name in FAMILIES:
        assert selfcheck.failure(name, "cpu", dtype) is None, name


@pytest.mark.parametrize("op,name", [("apa", "aglu"), ("anact", "nswish"), ("anact_rows", "nrelu/per_instance"),
                                     ("anact_stats", "nrelu")])
def test_a_wrong_or_raising_kernel_fails_the_check(monkeypatch, op, name):
    real = getattr(kernels, op)
    monkeypatch.setattr(kernels, op, lambda *a: real(*a) * 1.001)  # 0.1% off: outside fp32 tolerance
    assert "differs from the PyTorch path" in selfcheck.failure(name, "cpu", torch.float32)
    monkeypatch.setattr(kernels, op, raising)
    assert selfcheck.failure(name, "cpu", torch.float32) == "RuntimeError: ptxas fatal: simulated failure"


def test_a_wrong_lam_gradient_fails_the_check(monkeypatch):
    """The parameter gradients are checked too (sums over the probe, in fp32 on every dtype)."""
    real = kernels.apa_backward

    def off(*args):
        grad_z, grad_kappa, grad_lam = real(*args)
        return grad_z, grad_kappa, grad_lam * 1.01

    monkeypatch.setattr(kernels, "apa_backward", off)
    assert "lam gradient differs" in selfcheck.failure("apa", "cpu", torch.bfloat16)


def test_auto_checks_once_and_falls_back_with_one_line(auto_on_cpu, counted_aglu, monkeypatch, capsys):
    """Outside a trainer: the first call per (family, device, dtype) checks the kernel; a failing one gives the
    PyTorch path's exact result and one line naming the activation, the device and the reason."""
    auto, plain, x, calls = counted_aglu
    torch.testing.assert_close(auto(x), plain(x))
    checked = len(calls)
    assert checked > 1  # the probe ran the kernel, then the forward used it
    auto(x)
    assert len(calls) == checked + 1  # checked once
    assert not capsys.readouterr().out

    monkeypatch.setattr(impl, "TRUSTED", {})
    monkeypatch.setattr(kernels, "apa", raising)
    assert torch.equal(auto(x), plain(x)) and torch.equal(auto(x), plain(x))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aglu: PyTorch path") and "cpu (float32)" in lines[0]
    assert "RuntimeError: ptxas fatal: simulated failure" in lines[0]


def test_select_keeps_the_faster_path(auto_on_cpu, monkeypatch, capsys):
    """A path made artificially slow loses, whichever it is; both times are printed and returned."""
    from activations.aglu import _APAFunction

    def slow(fn, seconds):
        return lambda *a: time.sleep(seconds) or fn(*a)

    model = torch.nn.Sequential(activations.build("aglu"), activations.build("aglu"))
    monkeypatch.setattr(_APAFunction, "apply", slow(_APAFunction.apply, 0.1))
    decisions = selfcheck.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False)
    assert decisions["aglu"]["impl"] == "triton" and [m.impl for m in model] == ["triton", "triton"]
    assert decisions["aglu"]["torch_ms"] > 100 > decisions["aglu"]["triton_ms"]
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("aglu: Triton kernel (Triton ") and "eager fwd+bwd at 8x64 on cpu, float32" in line

    monkeypatch.undo()
    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(kernels, "apa", slow(kernels.apa, 0.1))
    model = torch.nn.Sequential(activations.build("aglu"))
    decisions = selfcheck.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False)
    assert decisions["aglu"]["impl"] == "torch" == model[0].impl
    assert decisions["aglu"]["triton_ms"] > 100 > decisions["aglu"]["torch_ms"]
    assert capsys.readouterr().out.startswith("aglu: PyTorch path (Triton ")


def test_select_on_platforms_without_the_kernels(monkeypatch, capsys):
    """CPU: the PyTorch path, silently (recorded for run.json); channelwise parameters never take the kernels."""
    model = torch.nn.Sequential(activations.build("nswish"), activations.build("aglu", channelwise=True,
                                                                                 num_channels=8))
    decisions = selfcheck.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False)
    assert decisions == {
        "nswish": {"impl": "torch", "reason": "not a CUDA device (cpu)", "triton_ms": None, "torch_ms": None},
        "channelwise": {"impl": "torch", "reason": "channelwise parameters always take the PyTorch path",
                        "triton_ms": None, "torch_ms": None}}
    assert [m.impl for m in model] == ["torch", "torch"] and not capsys.readouterr().out
    gpu = dict(device_type="cuda", name="Tesla P100-PCIE-16GB", capability=(6, 0), bf16=False, triton="3", inductor=True)
    assert "sm_60; Triton needs compute capability 7.0" in selfcheck.blocker(Platform(**gpu))
    monkeypatch.setattr(impl, "kernels", None)
    assert selfcheck.blocker(Platform(**{**gpu, "capability": (9, 0)})) == "Triton is not installed"
    assert selfcheck.select(torch.nn.Sequential(activations.build("relu")), (8, 64), CPU, "cpu", torch.float32,
                            compiled=False) == {}


RANKS = """
import json, sys
import torch
import torch.distributed as dist
import activations
from activations import impl, kernels, selfcheck
from training.distributed import setup
from training.hardware import Platform

impl.KERNEL_DEVICES = ("cuda", "cpu")
d = setup("cpu")
if d.rank == 1:  # a kernel that fails on one rank only
    def raising(*args):
        raise RuntimeError("ptxas fatal: simulated failure")
    kernels.apa = raising
# nswish passes everywhere; the ranks disagree on which path is faster, their summed times decide
times = [{"triton": 1.0, "torch": 5.0}, {"triton": 4.0, "torch": 2.0}][d.rank]
selfcheck.time_paths = lambda *args: times
collectives = []
all_reduce = dist.all_reduce
dist.all_reduce = lambda *a, **k: collectives.append(1) or all_reduce(*a, **k)
model = torch.nn.Sequential(activations.build("aglu"), activations.build("nswish"))
decisions = selfcheck.select(model, (8, 64), Platform("cpu", "cpu", triton="3"), "cpu", torch.float32, False, d)
dist.all_reduce = all_reduce
with open(sys.argv[1] + f".{d.rank}.json", "w") as f:
    json.dump({"decisions": decisions, "impls": [m.impl for m in model], "collectives": len(collectives)}, f)
dist.destroy_process_group()
"""


def test_two_gloo_ranks_take_the_same_decision(tmp_path):
    """A kernel failing on rank 1 only makes both ranks use the PyTorch path; timings are summed over the ranks;
    one collective in all."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(script), str(tmp_path / "out")], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["impls"] == ["torch", "triton"] and r["collectives"] == 1
        assert r["decisions"]["nswish"]["triton_ms"] == 2.5 and r["decisions"]["nswish"]["torch_ms"] == 3.5
    assert ranks[0]["decisions"]["aglu"]["reason"] == "the Triton kernel failed on 1 other rank(s) (their lines say why)"
    assert "simulated failure" in ranks[1]["decisions"]["aglu"]["reason"]
    assert "rank 1: aglu: the Triton kernel failed its self-check on cpu, float32: RuntimeError: ptxas fatal" \
        in result.stdout


def test_a_run_falls_back_and_trains_as_the_pytorch_path(auto_on_cpu, monkeypatch, tmp_path, capsys):
    """train_gpt2 with a kernel that raises on this device: one line, the decision in run.json, and the run's
    losses equal to a run that asked for the PyTorch path."""
    from test_train_gpt2 import args, train_in_process, train_losses, write_corpus

    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "torch", act="aglu", act_kwargs='{"impl": "torch"}'))
    capsys.readouterr()
    monkeypatch.setattr(kernels, "apa", raising)
    train_in_process(args(data, tmp_path / "auto", act="aglu"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "aglu:" in line]
    assert lines == ["aglu: PyTorch path (the Triton kernel failed its self-check on cpu, float32: "
                     "RuntimeError: ptxas fatal: simulated failure)"]
    decisions = json.loads((tmp_path / "auto" / "run.json").read_text())["environment"]["decisions"]
    assert decisions["activations"]["aglu"]["impl"] == "torch"
    assert decisions["precision"]["value"] == "float32" and decisions["compile"]["value"] is False
    assert train_losses(tmp_path / "auto") == train_losses(tmp_path / "torch")


def test_auto_under_compile_is_one_graph_and_checks_nothing_inside(auto_on_cpu, counted_aglu):
    """Inside torch.compile "auto" runs no check: it takes the kernel only where an eager call (or a trainer's
    select) checked it before, else the PyTorch path; either way one graph, no break."""
    torch._dynamo.reset()
    auto, plain, x, calls = counted_aglu
    try:
        torch.testing.assert_close(torch.compile(auto, backend="aot_eager", fullgraph=True)(x), plain(x))
        assert not calls and not impl.TRUSTED
        auto(x)  # eager: the check runs, the kernel is trusted
        assert impl.TRUSTED == {("aglu", "cpu", torch.float32): True}
        torch._dynamo.reset()
        checked = len(calls)
        torch.testing.assert_close(torch.compile(auto, backend="aot_eager", fullgraph=True)(x), plain(x))
        assert len(calls) > checked
    finally:
        torch._dynamo.reset()
