"""bench/gpu_check.py (its sections run by bench/check_runner.py) on a machine without a GPU (CI): it runs what
applies (every kernel against the PyTorch path, in Triton's interpreter), lists what it skipped, writes its JSON and
markdown, and exits 0. On simulated GPUs (training/hardware.py's Platform, as in tests/test_hardware.py): the dtypes
it checks, and the step section's rows for the path a run takes (activations/policy.select()'s decision) beside the
forced kernel and PyTorch paths."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from training.hardware import Platform

ROOT = Path(__file__).resolve().parents[1]
H100 = Platform("cuda", "NVIDIA H100 80GB HBM3", (9, 0), True, "3.4.0", True)  # tests/test_hardware.py's
V100 = Platform("cuda", "Tesla V100-SXM2-32GB", (7, 0), False, "3.4.0", True)
P100 = Platform("cuda", "Tesla P100-PCIE-16GB", (6, 0), False, "3.4.0", True)


@pytest.mark.long
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the full command is the test: run it by hand")
def test_cpu_part_passes_and_lists_what_it_skipped(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # the script switches the interpreter on by itself when there is no GPU
    result = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "leaked" not in result.stderr, result.stderr  # nothing at exit (tests/test_bench_scripts.py's promise)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    results = report["results"]
    assert results["kernels"]["status"] == "PASS"
    figures = results["kernels"]["figures"]
    assert len(figures) == 18 and set(figures.values()) == {"ok"}  # 6 kernel families x (bf16, fp16, fp32)
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


def test_kernels_are_checked_in_the_dtypes_a_run_there_uses(monkeypatch):
    from activations import selfcheck
    from bench import gpu_check

    assert gpu_check.run_dtypes(H100) == [torch.bfloat16, torch.float16, torch.float32]
    assert gpu_check.run_dtypes(V100) == [torch.float16, torch.float32]  # no bf16: --dtype bfloat16 is refused there
    pytest.importorskip("triton")
    checked = []
    monkeypatch.setattr(selfcheck, "failure", lambda name, device, dtype: checked.append(dtype))
    ctx = SimpleNamespace(device="cpu", platform=V100, smoke=False, quick=True)
    ok, figures = gpu_check.check_kernels(ctx)
    assert ok and set(checked) == {torch.float16, torch.float32} and len(checked) == 12
    assert figures["dtypes"] == "float16, float32: Tesla V100-SXM2-32GB has no bf16, so no run there uses it"


def test_quick_runs_what_decides_safety_and_says_how_long():
    from bench import gpu_check

    names, line = gpu_check.plan(gpu_check.SECTIONS, True, lambda n: True)
    assert names == ["kernels", "resume", "hellaswag"] and "at most 3 min 10 s in all" in line
    names, line = gpu_check.plan(gpu_check.SECTIONS, False, lambda n: n != "ddp")  # one GPU: one 10-minute window
    assert len(names) == 8 and line.endswith("at most 10 min 0 s in all (15 s of it starting and reporting)")
    assert "ddp" not in line


def test_a_child_past_its_sections_bound_is_stopped(tmp_path):
    """With what it started: a grandchild (torchrun's workers, a probe) once outlived the section on the GPU."""
    from bench import check_runner

    ctx = SimpleNamespace(bound=1, deadline=time.time() + 1)
    t0 = time.time()
    pid_file = tmp_path / "grandchild"
    spawn = (f"import pathlib, subprocess, time; p = subprocess.Popen(['sleep', '60']); "
             f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid)); time.sleep(60)")
    with pytest.raises(check_runner.OverBound, match="did not finish within the section's 1 s bound; stopped"):
        check_runner.run(ctx, [sys.executable, "-c", spawn])
    assert time.time() - t0 < 10
    status = Path(f"/proc/{pid_file.read_text()}/status")
    time.sleep(0.2)
    assert not status.exists() or "State:\tZ" in status.read_text()  # gone (or dead, waiting for init to reap it)
    with pytest.raises(check_runner.OverBound, match="the section's 1 s bound was spent before it finished"):
        check_runner.run(ctx, [sys.executable, "-c", "pass"])  # nothing starts once the bound is spent


def test_on_a_gpu_each_section_is_a_child_that_reports_before_its_bound(tmp_path, monkeypatch):
    """The parent's and the child's side of section_in_child, the child's main run in this process: the child
    stops its own work CHILD_MARGIN before the parent would stop it, and its result comes back as the parent's."""
    from bench import check_runner, gpu_check

    deadlines = []
    monkeypatch.setitem(gpu_check.CHECKS, "loss_chunks", lambda ctx: deadlines.append(ctx.deadline) or (True, {"x": 1}))
    monkeypatch.setattr(check_runner, "run", lambda ctx, cmd: gpu_check.main([str(c) for c in cmd[2:]]))
    ctx = SimpleNamespace(out=tmp_path, bound=30, deadline=time.time() + 30)
    flags = ["--out", tmp_path, "--reps", 3]
    script = "bench/gpu_check.py"
    assert check_runner.section_in_child(script, "loss_chunks", ctx, flags) == {"status": "PASS", "figures": {"x": 1}}
    assert deadlines == [pytest.approx(ctx.deadline - check_runner.CHILD_MARGIN)]
    assert check_runner.section_in_child(script, "ddp", ctx, flags)["reason"] == "0 GPU(s): DDP needs 2 or more"

    def dies(ctx, cmd):
        raise RuntimeError("bench/gpu_check.py --section=attention exited -9: ")
    monkeypatch.setattr(check_runner, "run", dies)
    assert check_runner.section_in_child(script, "attention", ctx, flags) == {
        "status": "FAIL", "reason": "bench/gpu_check.py --section=attention exited -9: "}


@pytest.fixture
def fake_train_step(monkeypatch):
    """bench/train_step.py's run replaced: one made-up result per contender, the commands kept."""
    from bench import gpu_check
    from bench.train_step import split_acts

    commands = []

    def run(ctx, cmd, env=None):
        commands.append(cmd)
        specs = split_acts(str(cmd[cmd.index("--acts") + 1]))
        results = {spec: {"ms_per_step": 10.0 + i, "tok_per_s": 1000.0 - i, "mfu": None, "peak_bytes": None,
                          "held_bytes": 2**20}
                   for i, spec in enumerate(specs)}
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"results": results}))

    monkeypatch.setattr(gpu_check, "run", run)
    return commands


@pytest.mark.parametrize("faster", ["triton", "torch"])
def test_the_step_section_times_the_path_a_run_takes(tmp_path, monkeypatch, fake_train_step, faster):
    """A simulated H100 (kernels in Triton's interpreter on CPU tensors): the section asks policy.select() what the
    trainers ask, at the step's MLP shape, dtype and compile choice (its child runs tests/probe_work.py's timings);
    the run's row is labelled with that decision, beside the kernel and the PyTorch path forced."""
    pytest.importorskip("triton")
    import probe_work
    from activations import impl, policy, selfcheck
    from bench import gpu_check

    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    # the elementwise decision only: the fused MLP's probe (interpreted here, tens of CPU-s) is
    # tests/test_kernel_policy.py's
    monkeypatch.setattr(policy, "FUSED_DEVICES", ())
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))
    work = probe_work.kernel_faster if faster == "triton" else probe_work.kernel_slower
    ms = work(None, None, None, None, None, None)
    monkeypatch.setattr(selfcheck, "probe", work)  # what policy.select hands its child
    asked, select = [], policy.select
    monkeypatch.setattr(policy, "select", lambda model, shape, platform, device, dtype, compiled, *a, **k:
                        asked.append((shape, dtype, compiled)) or select(model, shape, platform, device, dtype,
                                                                         compiled, *a, **k))
    ctx = SimpleNamespace(device="cpu", platform=H100, smoke=True, out=tmp_path, precision="bfloat16", compile=True,
                          bound=600, deadline=time.time() + 600)
    ok, fig = gpu_check.check_train_step(ctx)
    assert ok and asked == [((2 * 64, 4 * 128), torch.bfloat16, True)] * 2  # tiny preset, B=2, T=64
    cmd, = fake_train_step
    acts = cmd[cmd.index("--acts") + 1]
    assert acts == ('reference,gelu,aglu{"impl": "triton"},aglu{"impl": "torch"},'
                    'nswish{"impl": "triton"},nswish{"impl": "torch"}')
    for act in ("aglu", "nswish"):
        run_row = fig[f"{act} [run: {faster}]"]
        assert run_row.pop("why").startswith(f"Triton {ms['triton']:.3f} ms vs PyTorch {ms['torch']:.3f} ms")
        assert run_row == fig[f"{act} [forced {faster}]"] != fig[f"{act} [forced {'torch' if faster == 'triton' else 'triton'}]"]
        assert f"{act} [run: {'torch' if faster == 'triton' else 'triton'}]" not in fig


def test_the_step_section_on_a_gpu_the_kernels_cannot_run_on(tmp_path, fake_train_step):
    from bench import gpu_check

    ctx = SimpleNamespace(device="cpu", platform=P100, smoke=True, out=tmp_path, precision="float16", compile=False,
                          bound=600, deadline=time.time() + 600)
    ok, fig = gpu_check.check_train_step(ctx)
    cmd, = fake_train_step
    assert ok and cmd[cmd.index("--acts") + 1] == 'reference,gelu,aglu{"impl": "torch"},nswish{"impl": "torch"}'
    assert "Triton needs compute capability 7.0" in fig["aglu [run: torch]"]["why"]
    assert fig["aglu [forced triton]"] == {"not run": "the kernel cannot run here: Tesla P100-PCIE-16GB is sm_60; "
                                                      "Triton needs compute capability 7.0 or newer"}


def test_the_step_section_times_a_training_step_on_this_device():
    """gpu_check's step rows build bench/train_step.py's contenders from its own arguments: they must carry
    everything train_step's build and step read (its precision and shape once were missing: a GPU-only failure)."""
    from bench.gpu_check import step_ms

    ms, tok_per_s = step_ms(SimpleNamespace(device="cpu", precision="float32"), "tiny", 1, 8, "nswish", False, 1)
    assert ms > 0 and tok_per_s > 0



def test_each_contender_holds_its_state_only_and_its_peak_is_its_own(tmp_path, monkeypatch):
    """bench/train_step.py with CUDA's memory API stood in for on the CPU: when each contender's peak is measured,
    what is alive is exactly what the contenders not yet measured hold (weights, optimizer state, batches), no
    graph of an earlier one (an eager forward once kept 17,060 MiB per contender alive on a GPU), and its peak is
    its own steps' (a reset per contender, the others' bytes out), not the run's so far."""
    import gc

    from bench import train_step
    from bench.contender_memory import live_bytes  # CPU tensors' bytes: torch.cuda.memory_allocated's stand-in

    step_bytes = 1000  # what the stand-in's peak adds to the bytes alive: a step's activations
    alive, before_each = [], []
    fake = SimpleNamespace(memory_allocated=lambda: alive.append(live_bytes()) or alive[-1],
                           reset_peak_memory_stats=lambda: before_each.append(alive[-1]),
                           max_memory_allocated=lambda: live_bytes() + step_bytes, empty_cache=lambda: None)
    monkeypatch.setattr(train_step, "device_memory", lambda device: fake)
    shape = '{"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "block_size": 16}'
    frozen = gc.get_freeze_count()  # an xdist worker froze what it held after collecting (tests/conftest.py)
    gc.collect()  # a kept graph of an eager forward is a cycle through autograd that gc cannot free
    gc.freeze()
    try:
        train_step.main(["--acts", 'reference,aglu,nswish{"loss_chunks": 2}', "--shape", shape, "--batch-size",
                         "2", "--seq-len", "16", "--rounds", "1", "--steps", "1", "--warmup", "1",
                         "--json", str(tmp_path / "steps.json")])
        gc.collect()
        left = live_bytes()
    finally:
        if not frozen:
            gc.unfreeze()
    results = list(json.loads((tmp_path / "steps.json").read_text())["results"].values())
    held = [r["held_bytes"] for r in results]
    assert min(held) > 0
    assert before_each == [sum(held[k:]) for k in range(len(held))]
    assert [r["peak_bytes"] for r in results] == [h + step_bytes for h in held]
    assert [r["kept_bytes"] for r in results] == [0] * len(held)  # what train_step reports on a GPU
    assert left == 0  # all freed


def test_a_driver_too_old_for_the_wheel_stops_it_in_one_line_before_any_check(tmp_path, monkeypatch):
    """The GPU image of a cluster: torch 2.11's PyPI wheel (CUDA 13.0) on a V100 with a 535 driver (CUDA 12.2)."""
    from bench import gpu_check
    from training.hardware import CudaStack

    stack = CudaStack("2.11.0+cu130", (13, 0), (12, 2), (("Tesla V100-SXM2-32GB", (7, 0)),))
    monkeypatch.setattr(gpu_check, "read_cuda_stack", lambda: stack)
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(["--out", str(tmp_path / "out")])
    message = str(stopped.value)
    assert message.startswith("error: torch 2.11.0+cu130 is built for CUDA 13.0") and "\n" not in message
    assert "pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cu126" in message
    assert not (tmp_path / "out").exists()  # no check ran, nothing written
