"""activations/selfcheck.py and policy.py: impl="auto" uses a Triton kernel only after it matches the PyTorch path
on the device, keeps the faster correct path, and takes the same decision on every rank.

No GPU here: the kernels run in Triton's interpreter (tests/conftest.py), and the tests let "auto" consider
CPU tensors (impl.KERNEL_DEVICES), which a real run never does. What policy.py's child process runs is injected
from tests/probe_work.py where the test is about the decision, not the kernel; tests/test_kernel_policy.py
has the child's failures, the cache and the recorded decisions."""
import json

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: the kernels cannot run")

import activations  # noqa: E402
from activations import impl, kernels, policy, selfcheck  # noqa: E402
from training.hardware import Platform  # noqa: E402

if not kernels.INTERPRETED:
    pytest.skip("the kernels need Triton's interpreter here (tests/conftest.py sets TRITON_INTERPRET=1)",
                allow_module_level=True)

CPU = Platform("cpu", "cpu", None, True, "3", True)
FAMILIES = ["aglu", "apa", "nswish", "nrelu", "nswish/per_instance", "nrelu/per_instance"]


@pytest.fixture
def auto_on_cpu(monkeypatch, tmp_path):
    """"auto" considers CPU tensors (the interpreter runs the kernels), with no decision yet and an empty verdict
    cache."""
    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(impl, "TRUSTED", {})
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))


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


def test_auto_takes_the_kernel_only_where_decided(auto_on_cpu, counted_aglu, capsys):
    """Outside a trainer's decision "auto" checks nothing in this process (a kernel never run on this GPU must not
    run here): the PyTorch path's exact result, silently; a decision in impl.TRUSTED switches the kernel on."""
    auto, plain, x, calls = counted_aglu
    assert torch.equal(auto(x), plain(x)) and not calls and not impl.TRUSTED
    impl.TRUSTED[("aglu", "cpu", torch.float32)] = True
    torch.testing.assert_close(auto(x), plain(x))
    assert len(calls) == 1 and not capsys.readouterr().out


def test_select_keeps_the_faster_path(auto_on_cpu, capsys):
    """The faster path wins, whichever it is; both times are printed and returned, and "auto" modules elsewhere
    follow the decision (impl.TRUSTED)."""
    import probe_work

    model = torch.nn.Sequential(activations.build("aglu"), activations.build("aglu"))
    decisions = policy.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False, work=probe_work.kernel_faster)
    assert decisions["aglu"]["impl"] == "triton" and [m.impl for m in model] == ["triton", "triton"]
    assert (decisions["aglu"]["triton_ms"], decisions["aglu"]["torch_ms"]) == (1.0, 2.0)
    assert impl.TRUSTED == {("aglu", "cpu", torch.float32): True}
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("aglu: Triton kernel (Triton 1.000 ms vs PyTorch 2.000 ms, eager fwd+bwd at 8x64 on cpu, "
                           "float32; probed in a child process)")

    model = torch.nn.Sequential(activations.build("nswish"))
    decisions = policy.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False, work=probe_work.kernel_slower)
    assert decisions["nswish"]["impl"] == "torch" == model[0].impl
    assert (decisions["nswish"]["triton_ms"], decisions["nswish"]["torch_ms"]) == (3.0, 2.0)
    assert capsys.readouterr().out.startswith("nswish: PyTorch path (Triton 3.000 ms vs PyTorch 2.000 ms")


def test_select_on_platforms_without_the_kernels(monkeypatch, capsys):
    """CPU: the PyTorch path, silently (recorded for run.json); channelwise parameters never take the kernels."""
    model = torch.nn.Sequential(activations.build("nswish"), activations.build("aglu", channelwise=True,
                                                                                 num_channels=8))
    decisions = policy.select(model, (8, 64), CPU, "cpu", torch.float32, compiled=False)
    key = policy.decision_key(CPU, torch.float32, (8, 64), False)
    assert decisions == {
        "nswish": {"impl": "torch", "reason": "not a CUDA device (cpu)", "triton_ms": None, "torch_ms": None,
                   "key": key, "source": "platform"},
        "channelwise": {"impl": "torch", "reason": "channelwise parameters always take the PyTorch path",
                        "triton_ms": None, "torch_ms": None, "key": key, "source": "platform"}}
    assert [m.impl for m in model] == ["torch", "torch"] and not capsys.readouterr().out
    gpu = dict(device_type="cuda", name="Tesla P100-PCIE-16GB", capability=(6, 0), bf16=False, triton="3", inductor=True)
    assert "sm_60; Triton needs compute capability 7.0" in selfcheck.blocker(Platform(**gpu))
    monkeypatch.setattr(impl, "kernels", None)
    assert selfcheck.blocker(Platform(**{**gpu, "capability": (9, 0)})) == "Triton is not installed"
    assert policy.select(torch.nn.Sequential(activations.build("relu")), (8, 64), CPU, "cpu", torch.float32,
                         compiled=False) == {}




@pytest.mark.long
@pytest.mark.xdist_group("two_rank_runs")
def test_two_gloo_ranks_take_the_same_decision(two_rank_runs):
    """A kernel failing on rank 1 only makes both ranks use the PyTorch path; timings are summed over the ranks;
    one collective in all (tests/selfcheck_ranks.py, a command of tests/two_rank_runs.py's torchrun job)."""
    ranks = [json.loads((two_rank_runs / f"selfcheck.{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["impls"] == ["torch", "triton"] and r["collectives"] == 1
        assert r["decisions"]["nswish"]["triton_ms"] == 2.5 and r["decisions"]["nswish"]["torch_ms"] == 3.5
    assert ranks[0]["decisions"]["aglu"]["reason"] == "the Triton kernel failed on 1 other rank(s) (their lines say why)"
    assert "simulated failure" in ranks[1]["decisions"]["aglu"]["reason"]
    assert "rank 1: aglu: the Triton kernel failed its check on cpu, float32: RuntimeError: ptxas fatal" \
        in (two_rank_runs / "job.log").read_text()


def test_a_run_falls_back_and_trains_as_the_pytorch_path(auto_on_cpu, monkeypatch, tmp_path, capsys):
    """train_gpt2 with a kernel that raises on this device: one line, the decision in run.json, and the run's
    losses equal to a run that asked for the PyTorch path."""
    import probe_work
    from test_train_gpt2 import args, train_in_process, train_losses, write_corpus

    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "torch", act="aglu", act_kwargs='{"impl": "torch"}'))
    capsys.readouterr()
    monkeypatch.setattr(selfcheck, "probe", probe_work.raising)
    train_in_process(args(data, tmp_path / "auto", act="aglu"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "aglu:" in line]
    assert lines == ["aglu: PyTorch path (the Triton kernel failed its check on cpu, float32: "
                     "RuntimeError: ptxas fatal: simulated failure; probed in a child process)"]
    decisions = json.loads((tmp_path / "auto" / "run.json").read_text())["environment"]["decisions"]
    assert decisions["activations"]["aglu"]["impl"] == "torch"
    assert decisions["precision"]["value"] == "float32" and decisions["compile"]["value"] is False
    assert train_losses(tmp_path / "auto") == train_losses(tmp_path / "torch")


def test_auto_under_compile_is_one_graph_and_follows_the_decision(auto_on_cpu, counted_aglu):
    """Inside torch.compile "auto" reads the decision table like eager calls do: the PyTorch path until a decision
    says the kernel, then the kernel; either way one graph, no break."""
    torch._dynamo.reset()
    auto, plain, x, calls = counted_aglu
    try:
        torch.testing.assert_close(torch.compile(auto, backend="aot_eager", fullgraph=True)(x), plain(x))
        assert not calls and not impl.TRUSTED
        impl.TRUSTED[("aglu", "cpu", torch.float32)] = True
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(auto, backend="aot_eager", fullgraph=True)(x), plain(x))
        assert calls
    finally:
        torch._dynamo.reset()
