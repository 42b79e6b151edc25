"""Activation telemetry: measured statistics against float64 hand computations, module state read back
exactly, no side effects on the model or the RNG, and the trainer logging it at each evaluation."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import activations
import train_gpt2
from activations import telemetry
from training.runlog import _scalars
from model import GPT, GPTConfig


class Net(nn.Module):
    """The smallest thing with an `act`: the activation applied to the input."""

    def __init__(self, name):
        super().__init__()
        self.act = activations.build(name)

    def forward(self, x):
        return self.act(x)


def test_relu_statistics_match_float64_hand_computation():
    x = torch.randn(16, 3000, generator=torch.Generator().manual_seed(0)) * 1.7 + 0.3
    x[0, :50] = 0.004  # a few outputs in (0, 1e-2): near zero though positive
    got = telemetry.collect(Net("relu"), x, max_rows=8)
    (layer,) = got["layers"]
    x64 = x[:8].double()
    y64 = x64.clamp(min=0)
    rho = ((y64 - y64.mean()) ** 2).mean() / ((x64 - x64.mean()) ** 2).mean()
    rho_prime = (x64 > 0).double().mean()  # relu'(x)^2 = 1[x > 0]
    assert layer["name"] == "act" and layer["kind"] == "ReLU" and "params" not in layer
    assert layer["rho"] == pytest.approx(rho.item(), rel=1e-12)
    assert layer["rho_prime"] == pytest.approx(rho_prime.item(), rel=1e-12)
    assert layer["sparsity"] == pytest.approx((y64.abs() < 1e-2).double().mean().item(), rel=1e-12)
    assert layer["out_mean"] == pytest.approx(y64.mean().item(), rel=1e-12)
    assert layer["out_std"] == pytest.approx(y64.std(correction=0).item(), rel=1e-12)
    assert got["anact_score"] == pytest.approx((abs(math.log(rho)) + abs(math.log(rho_prime))) / 2, rel=1e-12)


def test_gelu_rho_prime_is_the_elementwise_derivative():
    x = torch.randn(4, 5000, generator=torch.Generator().manual_seed(1))
    (layer,) = telemetry.collect(Net("gelu"), x)["layers"]
    x64 = x.double().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.nn.functional.gelu(x64, approximate="tanh").sum(), x64)
    assert layer["rho_prime"] == pytest.approx(grad.square().mean().item(), rel=1e-6)


def test_relu_on_standard_normal_approaches_the_spec_constants():
    x = torch.randn(8, 250_000, generator=torch.Generator().manual_seed(2))
    (layer,) = telemetry.collect(Net("relu"), x)["layers"]
    assert layer["rho"] == pytest.approx(0.340845, abs=3e-3)  # SPEC §1 reference values for ReLU
    assert layer["rho_prime"] == pytest.approx(0.5, abs=2e-3)
    assert layer["sparsity"] == pytest.approx(0.5 + 0.01 * 0.398942, abs=3e-3)  # P(x<=0) + P(0<x<0.01)


def tiny_gpt(act, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=16, act=act, **kw), seed=0)


def test_aglu_telemetry_is_the_parameters():
    model = tiny_gpt("aglu")
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            block.mlp.act.kappa.fill_(0.5 + i)
            block.mlp.act.lam.fill_(0.25 * (i + 1))
    got = telemetry.collect(model, torch.randint(0, 64, (2, 16)))
    assert [layer["name"] for layer in got["layers"]] == [f"transformer.h.{i}.mlp.act" for i in range(3)]
    for i, layer in enumerate(got["layers"]):
        assert layer["params"] == {"kappa": 0.5 + i, "lam": 0.25 * (i + 1)}
        assert 0 < layer["rho"] and 0 < layer["rho_prime"] and 0 <= layer["sparsity"] <= 1


def test_nswish_telemetry_is_the_running_state_and_collect_has_no_side_effects():
    model = tiny_gpt("nswish", plain_top_k=1)
    model.train()
    model(torch.randint(0, 64, (4, 16)))  # one training step initialises the running statistics
    activations.step_statistics(model)
    with torch.no_grad():
        model.transformer.h[0].mlp.act.alpha.fill_(0.3)
    state = lambda: {**model.state_dict(), **dict(model.named_buffers())}  # noqa: E731 (the pending sums too)
    before = {k: v.clone() for k, v in state().items()}
    x = torch.randint(0, 64, (2, 16))
    rng = torch.get_rng_state()
    got = telemetry.collect(model, x)
    assert model.training and torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in state().items())
    assert all(p.grad is None for p in model.parameters())
    layers = got["layers"]
    assert [layer["kind"] for layer in layers][-1] == "SiLU" and "params" not in layers[-1]  # plain top layer
    for layer, block in zip(layers[:2], model.transformer.h):
        act = block.mlp.act
        assert layer["params"] == {k: pytest.approx(float(v)) for k, v in act.telemetry().items()}
        state = act.state_dict()
        for key, name in [("alpha", "alpha"), ("rho", "running_rho"), ("rho_prime", "running_rho_prime"),
                          ("mu", "running_mu")]:
            assert layer["params"][key] == state[name].item()
        rho, rho_prime = state["running_rho"].double(), state["running_rho_prime"].double()
        lam_n = torch.sqrt((rho + rho_prime) / (2 * rho * rho_prime))  # ANAct Eq. 13, beta = 0.3
        assert layer["params"]["scale"] == pytest.approx((lam_n + 0.3 * torch.tanh(state["alpha"].double())).item())
    assert layers[0]["params"]["alpha"] == pytest.approx(0.3)
    assert got["anact_score"] == pytest.approx(
        sum((abs(math.log(l["rho"])) + abs(math.log(l["rho_prime"]))) / 2 for l in layers))


def test_collect_needs_activations():
    with pytest.raises(ValueError, match="no submodule named 'act'"):
        telemetry.collect(nn.Linear(2, 2), torch.zeros(1, 2))


def test_tensorboard_tags_of_nested_records():
    record = {"val_loss": 2.5, "telemetry": {"layers": [{"name": "h.0", "rho": 0.5, "params": {"kappa": 1.1}}],
                                             "anact_score": 0.3}, "flag": True}
    assert dict(_scalars(record)) == {"val_loss": 2.5, "telemetry/layers/0/rho": 0.5,
                                      "telemetry/layers/0/params/kappa": 1.1, "telemetry/anact_score": 0.3}


def test_trainer_logs_telemetry_at_each_evaluation(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for idx, split in enumerate(["val", "train"]):
        np.save(data / f"synth_{split}_{idx:06d}.npy", rng.integers(0, 64, 2000).astype(np.uint16))
    argv = {"data-dir": data, "out-dir": tmp_path / "run", "vocab-size": 64, "block-size": 16, "n-layer": 2,
            "n-head": 2, "n-embd": 16, "batch-size": 2, "seq-len": 16, "total-batch-size": 32, "max-steps": 4,
            "warmup-steps": 1, "eval-interval": 2, "val-tokens": 32, "checkpoint-interval": 4, "device": "cpu",
            "compile": "false", "act": "aglu"}
    train_gpt2.main([item for k, v in argv.items() for item in (f"--{k}", str(v))])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert [layer["name"] for layer in r["telemetry"]["layers"]] == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
        assert set(r["telemetry"]["layers"][0]["params"]) == {"kappa", "lam"}
    ckpt = torch.load(tmp_path / "run" / "model_00004.pt", weights_only=True)
    final = evals[-1]["telemetry"]["layers"]
    assert final[1]["params"]["kappa"] == ckpt["model"]["transformer.h.1.mlp.act.kappa"].item()
