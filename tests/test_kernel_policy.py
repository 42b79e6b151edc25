"""activations/policy.py: the kernel/PyTorch decision is proven in a child process, cached on disk, recorded in the
run and its checkpoints, and reused; impl is a speed option, not part of a model's identity.

The child's work is injected from tests/probe_work.py (or is the real probe, the kernels in Triton's interpreter);
"auto" is let consider CPU tensors (impl.KERNEL_DEVICES), and the platform is named like a GPU, as a real run's is."""
import json
import shutil
import time

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: the kernels cannot run")

import activations  # noqa: E402
import probe_work  # noqa: E402
from activations import impl, kernels, policy, selfcheck  # noqa: E402
from training.hardware import Platform  # noqa: E402

if not kernels.INTERPRETED:
    pytest.skip("the kernels need Triton's interpreter here (tests/conftest.py sets TRITON_INTERPRET=1)",
                allow_module_level=True)

GPU = Platform("cpu", "NVIDIA Test GPU", None, True, "3", True)  # a CPU that the tests let take the kernels


@pytest.fixture
def children(monkeypatch, tmp_path):
    """"auto" considers CPU tensors, no decision yet, an empty verdict cache; returns the list of child launches."""
    monkeypatch.setattr(impl, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(impl, "TRUSTED", {})
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "cache"))
    launched = []
    real = policy.run_child
    monkeypatch.setattr(policy, "run_child", lambda work, *a: launched.append(work.__name__) or real(work, *a))
    return launched


@pytest.fixture
def probe_server():
    """policy.run_child's fork server started, torch imported in it, as after a run's first probe: its start (seconds
    on a loaded machine, and only once a process) falls inside the bound of whichever test of this worker is first."""
    assert policy.run_child(probe_work.kernel_faster, (None,) * 6, 600)[1] is None


def decide(act="aglu", platform=GPU, shape=(8, 64), **kwargs):
    model = torch.nn.Sequential(activations.build(act))
    return model, policy.select(model, shape, platform, "cpu", torch.float32, False, **kwargs)


@pytest.mark.parametrize("work, what, timeout", [
    (probe_work.raising, "RuntimeError: ptxas fatal: simulated failure", 600),
    (probe_work.aborting, "the probe process died by signal SIGABRT", 600),
    (probe_work.segfault, "the probe process died by signal SIGSEGV", 600),
    (probe_work.hanging, "no answer within 1 s (the probe was killed)", 1),
    (probe_work.wrong_values, "ProbeMismatch: kappa 1, lam 0.0001: output differs from the PyTorch path", 600),
], ids=["raises", "aborts", "segfaults", "hangs", "wrong-values"])
def test_a_child_that_fails_is_a_no_with_one_line(children, capsys, work, what, timeout):
    """Whatever ends the probe, the family takes the PyTorch path, one line names the activation, the GPU and what
    happened, and this process goes on unharmed."""
    model, decisions = decide(work=work, timeout=timeout)
    assert decisions["aglu"]["impl"] == "torch" == model[0].impl and decisions["aglu"]["source"] == "probed"
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("aglu: PyTorch path (the Triton kernel failed its check on NVIDIA Test GPU, float32: "
                           + what)
    assert line.endswith("; probed in a child process)") and children == [work.__name__]
    plain = activations.build("aglu", impl="torch")
    plain.load_state_dict(model[0].state_dict())
    x = torch.randn(4, 64)
    assert torch.equal(model(x), plain(x))
    assert impl.TRUSTED == {("aglu", "cpu", torch.float32): False}


def test_a_ranks_probes_end_before_the_votes_collective_gives_up(probe_server, children, capsys, tmp_path):
    """The vote's all_reduce waits --dist-timeout for a rank still probing: all of that rank's probes, hanging here
    (two families), end within probe_bound(--dist-timeout), and a verdict it cut short is not cached."""
    dist_timeout = 3.0  # the probes get 2.4 s, the hanging ones 4.8 s before
    model = torch.nn.Sequential(activations.build("aglu"), activations.build("nswish"))
    start = time.monotonic()
    decisions = policy.select(model, (8, 64), GPU, "cpu", torch.float32, False, work=probe_work.hanging,
                              timeout=policy.probe_bound(dist_timeout))
    assert time.monotonic() - start < dist_timeout and children == ["hanging", "hanging"]
    assert {d["impl"] for d in decisions.values()} == {"torch"} and "no answer within" in decisions["aglu"]["reason"]
    assert policy.probe_bound(600.0) < 600.0 and not list((tmp_path / "cache" / "kernels").glob("*.json"))


def test_the_real_probe_passes_and_its_verdict_is_cached(children, capsys, tmp_path):
    """A passing child (the real probe: check, full-size comparison, timing) decides by its timings; the verdict is
    cached under the key, so a second run, another seed or another rank starts no child; a changed key probes
    again, and so does --kernel-reprobe."""
    _, first = decide("nswish")
    record = first["nswish"]
    assert record["impl"] in ("triton", "torch") and record["triton_ms"] > 0 and record["torch_ms"] > 0
    assert children == ["probe"] and record["source"] == "probed"
    cached = list((tmp_path / "cache" / "kernels").glob("nswish-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["key"] == record["key"]
    capsys.readouterr()

    model, again = decide("nswish")
    assert children == ["probe"] and again["nswish"]["impl"] == record["impl"] == model[0].impl
    assert again["nswish"]["source"].startswith("cached 20")
    assert (again["nswish"]["triton_ms"], again["nswish"]["torch_ms"]) == (record["triton_ms"], record["torch_ms"])
    assert capsys.readouterr().out.rstrip().endswith(f"; verdict {again['nswish']['source']}; --kernel-reprobe probes "
                                                     "again)")

    decide("nswish", shape=(8, 96), work=probe_work.kernel_faster)  # another shape: another key
    decide("nswish", work=probe_work.kernel_faster, reprobe=True)
    assert children == ["probe", "kernel_faster", "kernel_faster"]
    _, last = decide("nswish", work=probe_work.raising)  # the re-probed verdict replaced the cached one
    assert last["nswish"]["impl"] == "triton" and children[-1] == "kernel_faster"


def test_the_ranks_of_a_node_probe_once(children):
    """Ranks starting together with an empty cache: one probes (behind the verdict's file lock), the others wait
    and read its verdict. Threads stand in for the ranks (flock locks conflict between open files, not processes)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: decide(work=probe_work.slow_pass)[1]["aglu"], range(3)))
    assert children == ["slow_pass"] and {r["impl"] for r in results} == {"triton"}
    assert sorted(r["source"] == "probed" for r in results) == [False, False, True]


def test_a_cached_no_is_printed_as_such_with_its_date(children, capsys):
    decide(work=probe_work.raising)
    capsys.readouterr()
    model, decisions = decide(work=probe_work.kernel_faster)
    assert children == ["raising"] and model[0].impl == "torch"
    line, = capsys.readouterr().out.splitlines()
    date = decisions["aglu"]["source"].removeprefix("cached ")
    assert line == ("aglu: PyTorch path (the Triton kernel failed its check on NVIDIA Test GPU, float32: RuntimeError: "
                    f"ptxas fatal: simulated failure; verdict cached {date}; --kernel-reprobe probes again)")


def test_a_recorded_decision_is_reused_until_its_key_changes(children, capsys, tmp_path, monkeypatch):
    """What a resume does: the checkpoint's decision, same key, is taken as it is (no child, nothing timed, not even
    the cache read); on another GPU the run decides again and says why in one line."""
    _, recorded = decide(work=probe_work.kernel_faster)
    capsys.readouterr()
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "empty"))
    model, reused = decide(work=probe_work.raising, recorded=recorded)
    assert children == ["kernel_faster"] and model[0].impl == "triton"
    assert reused["aglu"] == {**recorded["aglu"], "source": "recorded"}
    assert capsys.readouterr().out == ("aglu: Triton kernel (Triton 1.000 ms vs PyTorch 2.000 ms, eager fwd+bwd at "
                                       "8x64 on NVIDIA Test GPU, float32; the recorded decision, not timed again)\n")

    other = Platform("cpu", "NVIDIA Other GPU", None, True, "3", True)
    model, again = decide(platform=other, work=probe_work.kernel_slower, recorded=recorded)
    assert children == ["kernel_faster", "kernel_slower"] and model[0].impl == "torch"
    first, second = capsys.readouterr().out.splitlines()
    assert first == ("aglu: the recorded kernel decision was made for another setting (gpu NVIDIA Test GPU -> NVIDIA "
                     "Other GPU); deciding again")
    assert second.startswith("aglu: PyTorch path (Triton 3.000 ms vs PyTorch 2.000 ms")


def test_resume_and_later_seeds_reuse_the_recorded_decision(children, monkeypatch, tmp_path, capsys):
    """train_gpt2: the decision is in run.json and in every checkpoint; --resume takes it from the checkpoint and
    --kernels-from (what a sweep gives its later seeds) from a run.json, without a child; resuming with another
    impl is allowed, and the checkpoint's model_config holds no impl."""
    from test_train_gpt2 import args, train_in_process, train_losses, write_corpus
    from training.checkpoint import load_checkpoint

    data = write_corpus(tmp_path / "data")
    monkeypatch.setattr(selfcheck, "probe", probe_work.kernel_slower)
    train_in_process(args(data, tmp_path / "full", act="aglu"))
    assert children == ["kernel_slower"]
    ckpt = load_checkpoint(tmp_path / "full" / "model_00004.pt")
    assert ckpt["kernels"]["aglu"]["impl"] == "torch" and ckpt["kernels"]["aglu"]["torch_ms"] == 2.0
    assert "impl" not in ckpt["model_config"]["act_kwargs"]

    monkeypatch.setattr(selfcheck, "probe", probe_work.raising)  # a probe now would say no
    monkeypatch.setenv("NANOACT_CACHE", str(tmp_path / "empty"))
    for name, extra in (("resumed", {}), ("other_impl", {"act_kwargs": '{"impl": "torch"}'})):
        shutil.copytree(tmp_path / "full", tmp_path / name, ignore=shutil.ignore_patterns("*00008*"))
        train_in_process(args(data, tmp_path / name, act="aglu", resume="true", **extra))
        assert train_losses(tmp_path / name) == train_losses(tmp_path / "full")
    decisions = json.loads((tmp_path / "resumed" / "run.json").read_text())["environment"]["decisions"]
    assert decisions["activations"] == {"aglu": {**ckpt["kernels"]["aglu"], "source": "recorded"}}

    train_in_process(args(data, tmp_path / "seed2", act="aglu", seed=2, kernels_from=tmp_path / "full"))
    decisions = json.loads((tmp_path / "seed2" / "run.json").read_text())["environment"]["decisions"]
    assert decisions["activations"]["aglu"]["source"] == "recorded" and children == ["kernel_slower"]


def test_a_checkpoint_trained_with_the_kernels_evaluates_samples_and_exports_on_a_cpu(
        make_checkpoint, hellaswag_file, gpt2_enc, monkeypatch, tmp_path):
    """A checkpoint whose model_config says {"impl": "triton"} (as every checkpoint of a kernel run did before impl
    left the model's identity) on a machine where the kernels cannot run: HellaSwag scores it, sample.py's loader
    generates from it and export writes it, all equal to the PyTorch path."""
    from eval.hellaswag import evaluate_model
    from model import GPT, GPTConfig
    from sample import load_model
    from test_export import exported_logits_match
    from export import to_transformers
    from training.checkpoint import load_checkpoint

    path = make_checkpoint(act="aglu", act_kwargs={"impl": "triton"})
    ckpt = load_checkpoint(path)
    reference = GPT(GPTConfig(**{**ckpt["model_config"], "act_kwargs": {"impl": "torch"}}), seed=0)
    reference.load_state_dict(ckpt["model"])
    reference.eval()
    monkeypatch.setattr(kernels, "INTERPRETED", False)  # as on a CPU-only machine: impl="triton" cannot run here
    model = GPT.from_checkpoint(load_checkpoint(path))
    items = hellaswag_file(n=4)
    scores = [evaluate_model(m, "cpu", data_path=items, progress=False) for m in (model, reference)]
    assert [{s: (r[s]["acc"], r[s]["acc_norm"], r[s]["n"]) for s in r} for r in scores] == 2 * [
        {s: (r[s]["acc"], r[s]["acc_norm"], r[s]["n"]) for s in r} for r in scores[1:]]
    idx = torch.zeros(1, 1, dtype=torch.long)
    sampled = [m.generate(idx, 5, generator=torch.Generator().manual_seed(0))
               for m in (load_model(str(path), "cpu"), reference)]
    assert torch.equal(*sampled)
    assert to_transformers.export(path, tmp_path / "hf") == "remote"
    diff, _, _ = exported_logits_match(path, tmp_path / "hf", trust_remote_code=True)
    assert diff < 1e-5 and "impl" not in (tmp_path / "hf" / "config.json").read_text()


def test_the_fused_mlp_is_chosen_only_where_it_measured_faster(children, capsys, tmp_path, monkeypatch):
    """The fused MLP (activations/fused_mlp.py) is a third path per activation, chosen by the probe's timings like the
    kernels: a gelu MLP (no kernel family), an AGLU one (its elementwise kernel decided first) and a gated one take it
    where the fused MLP measured faster, keep the unfused MLP where it measured slower or failed its check; the record
    (run.json's, the checkpoint's) says which with both timings; a recorded decision is reused without a probe."""
    class MLP(torch.nn.Module):
        def __init__(self, act, gated=False):
            super().__init__()
            self.c_fc, self.c_proj = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
            self.act = activations.build(act)
            self.c_up = torch.nn.Linear(16, 64) if gated else None
            self.fused = False  # as model.py's MLP starts

    def in_process(work, args, timeout):  # the decision rule under test, not the child process (tested above)
        children.append(work.__name__)
        try:
            return work(*args), None
        except RuntimeError as e:
            return None, f"RuntimeError: {e}"

    monkeypatch.setattr(policy, "run_child", in_process)
    monkeypatch.setattr(policy, "FUSED_DEVICES", ("cuda", "cpu"))
    model = torch.nn.Sequential(MLP("gelu"), MLP("aglu"), MLP("silu", gated=True))
    decisions = policy.select(model, (8, 64), GPU, "cpu", torch.float32, False, work=probe_work.kernel_slower,
                              fused_work=probe_work.kernel_faster)
    assert [m.fused for m in model] == [True, True, True] and model[1].act.impl == "torch"
    assert sorted(decisions) == ["aglu", "mlp/aglu", "mlp/gelu", "mlp/silu_glu"]
    assert decisions["mlp/gelu"]["impl"] == "fused" and decisions["mlp/gelu"]["triton_ms"] == 1.0
    assert decisions["mlp/gelu"]["key"]["d_model"] == 16
    out = capsys.readouterr().out
    assert "mlp/gelu: fused MLP (fused 1.000 ms vs unfused 2.000 ms, eager MLP fwd+bwd at 8x16x64 on NVIDIA" in out

    for work in (probe_work.kernel_slower, probe_work.raising):
        model = torch.nn.Sequential(MLP("gelu"))
        again = policy.select(model, (8, 64), GPU, "cpu", torch.float32, False, fused_work=work, reprobe=True)
        assert model[0].fused is False and again["mlp/gelu"]["impl"] == "unfused"
    assert "the fused MLP failed its check" in again["mlp/gelu"]["reason"]
    model = torch.nn.Sequential(MLP("gelu"))
    reused = policy.select(model, (8, 64), GPU, "cpu", torch.float32, False, recorded=decisions,
                           fused_work=probe_work.raising)
    assert model[0].fused and reused["mlp/gelu"]["source"] == "recorded"
    assert children == ["kernel_slower", *["kernel_faster"] * 3, "kernel_slower", "raising"]
    model = torch.nn.Sequential(MLP("gelu"), MLP("aglu"))  # --fused-mlp false: the off switch, no probe
    off = policy.select(model, (8, 64), GPU, "cpu", torch.float32, False, work=probe_work.kernel_slower,
                        fused_work=probe_work.kernel_faster, reprobe=True, fuse=False)
    assert [m.fused for m in model] == [False, False] and sorted(off) == ["aglu"]
    assert children[-1] == "kernel_slower"
