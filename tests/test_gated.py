"""The gated (GLU) MLP, down(act(x W_gate) * (x W_up)) (activations/gated.py), in GPT-2 and the translation FFN:
the formula against float64, gradcheck, parameter matching, telemetry, and gated checkpoints through training,
resume, --init-from, HellaSwag and sample.py (export and lm-eval's hf model: tests/test_export.py, test_lm_eval.py)."""
import dataclasses
import json
import math
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

import activations
import train_gpt2
import train_translation
from activations.gated import MATCH, hidden_width, mismatch, width_note
from sweep.plan import read_file
from activations.telemetry import collect
from model import GPT, MLP, GPTConfig
from test_train_gpt2 import VOCAB, args, cli_error, final_weights, train_in_process, train_losses, write_corpus
from training.checkpoint import load_checkpoint, save_checkpoint
from training.config import load_config
from translation.model import FFN, Transformer, TranslationConfig


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_gated_names_split_into_gate_and_form():
    assert [activations.mlp_activation(n) for n in ("swiglu", "geglu", "reglu", "aglu_glu", "leaky_relu2_glu")] == \
        [("silu", True), ("gelu", True), ("relu", True), ("aglu", True), ("leaky_relu2", True)]
    assert activations.mlp_activation("aglu") == ("aglu", False)
    for bad in ("swiglu_glu", "tanh_glu", "glu"):
        with pytest.raises(ValueError, match=r"unknown activation .*a gated MLP: swiglu, geglu, reglu or NAME_glu"):
            activations.mlp_activation(bad)


def test_gated_hidden_width_matches_the_plain_mlps_parameters():
    assert hidden_width(768, 3072, gated=False) == 3072 and hidden_width(768, 3072, gated=True) == 2048
    assert hidden_width(768, 3072, gated=True, bias=False) == 2048 and hidden_width(128, 512, True, override=300) == 300
    with pytest.raises(ValueError, match="this MLP is plain"):
        hidden_width(128, 512, gated=False, override=341)
    # GPT-2 124M: the same 4.72M weights per MLP; only the biases differ (2 x 2048 + 768 against 3072 + 768)
    plain, gated = MLP(GPTConfig(), 0), MLP(GPTConfig(act="swiglu"), 0)
    assert (gated.c_fc.out_features, gated.c_up.out_features, gated.c_proj.in_features) == (2048, 2048, 2048)
    assert n_params(gated) - n_params(plain) == 1024 and n_params(plain) == 4_722_432
    # the translation FFN of configs/translation_6l.toml, d 512 and ffn_dim 1024: no multiple of 64, 32 or 16 is
    # within 0.5% (704, the nearest multiple of 64, is +3.16%), 680 is (-0.36%)
    ffn, plain_ffn = FFN(TranslationConfig(act="swiglu"), 0, 6), FFN(TranslationConfig(), 0, 6)
    assert ffn.fc1.out_features == 680 and n_params(ffn) / n_params(plain_ffn) - 1 == pytest.approx(-0.00358, abs=1e-5)
    assert n_params(ffn) / n_params(plain_ffn) - 1 == pytest.approx(mismatch(512, 1024, 680), rel=1e-12)
    # d 128 (the CPU configs): 341, the nearest integer, as no multiple of 8 is within 0.5% (344 is +0.9%)
    assert hidden_width(128, 512, gated=True) == 341


def test_start_line_says_when_a_gated_mlp_does_not_match():
    assert width_note(512, 1024, gated=True) == "" and width_note(512, 1024, gated=False) == ""
    assert width_note(512, 1024, True, override=704) == " | gated MLP 704 wide: +3.16% parameters against the plain 1024"
    assert width_note(32, 64, True) == " | gated MLP 42 wide: -1.05% parameters against the plain 64"  # tiny: 43 is +1.3%


TRAINERS = {"gpt2": train_gpt2.TrainConfig, "translation": train_translation.TrainConfig}


def shipped_runs(path):
    """(trainer, argv) of a configs/ file: a sweep plan's variants (at each size of a ladder), or the trainer config
    itself."""
    table = tomllib.loads(path.read_text())
    if "trainer" in table:
        trainer, config, _, variants, _, _, ladder, _ = read_file(path)
        sizes = [[item for k, v in size.items() if k != "max_steps" for item in (f"--{k.replace('_', '-')}", str(v))]
                 for size in (ladder.sizes.values() if ladder else [{}])]
        return [(trainer, ["--config", str(ROOT / config), *options, *size]) for _, options, _ in variants
                for size in sizes]
    return [("gpt2" if "n_embd" in table["model"] else "translation", ["--config", str(path)])]


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_has_gated_mlps_within_half_a_percent(path):
    """Each trainer config and sweep variant as shipped when it is gated, its activation's gated form (NAME_glu)
    when it is plain: the gated MLP (built on the meta device) holds the plain MLP's parameters within 0.5%."""
    for trainer, argv in shipped_runs(path):
        cfg = load_config(TRAINERS[trainer], argv).model
        gate, gated = activations.mlp_activation(cfg.act)
        plain = dataclasses.replace(cfg, act=gate, glu_hidden=0)
        cfg = cfg if gated else dataclasses.replace(cfg, act=f"{gate}_glu")
        with torch.device("meta"):
            if trainer == "gpt2":
                counts = [n_params(MLP(c, 0)) for c in (cfg, plain)]
            else:
                counts = [n_params(FFN(c, 0, c.enc_layers)) for c in (cfg, plain)]
        assert abs(counts[0] / counts[1] - 1) <= MATCH, (argv, cfg.act, counts)


def gate_reference(act, z):
    """float64 formulas of the gate activations (act: the module, for AGLU's kappa and lam)."""
    name = type(act).__name__
    if name == "SiLU":
        return z * torch.sigmoid(z)
    if name == "GELU":  # GPT-2's tanh approximation
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
    if name == "ReLU":
        return z.clamp_min(0)
    if name == "ReLU2":
        return z.clamp_min(0) ** 2
    if name == "LeakyReLU2":
        return torch.where(z > 0, z, 0.5 * z) ** 2
    if name == "AGLU":  # Eq. 6 as printed
        kappa, lam = act.kappa.double(), act.lam.double()
        return z * (lam * torch.exp(-kappa * z) + 1) ** (-1 / lam)
    if name == "Mish":
        return z * torch.tanh(torch.log1p(torch.exp(z)))
    if name == "XATLU":  # the expanded gate (1 + 2 alpha) g - alpha, g = arctan / pi + 1/2
        alpha = act.alpha.double()
        return z * ((1 + 2 * alpha) * (torch.atan(z) / math.pi + 0.5) - alpha)
    if name == "PolyNorm":  # a_0 + sum a_i x^i / rms(x^i), the RMS over the gate's hidden units
        a = act.coeffs.double()
        return a[0] + sum(a[i] * z ** i / ((z ** i).square().mean(-1, keepdim=True) + 1e-6).sqrt() for i in (1, 2, 3))
    raise AssertionError(name)


GATED = ["swiglu", "geglu", "reglu", "relu2_glu", "leaky_relu2_glu", "aglu_glu", "mish_glu", "xatlu_glu",
         "polynorm_glu"]


@pytest.mark.parametrize("act", GATED)
@pytest.mark.parametrize("model", ["gpt2", "translation"])
def test_gated_mlp_is_the_formula_in_float64(act, model):
    torch.manual_seed(0)
    if model == "gpt2":
        mlp = MLP(GPTConfig(n_embd=32, n_layer=2, n_head=2, act=act), 0).eval()
        gate, up, down = mlp.c_fc, mlp.c_up, mlp.c_proj
    else:
        mlp = FFN(TranslationConfig(d_model=32, ffn_dim=96, act=act), 0, 2).eval()
        gate, up, down = mlp.fc1, mlp.fc_up, mlp.fc2
    x = torch.randn(3, 5, 32) * 2

    def linear(layer, h):
        return h @ layer.weight.double().t() + layer.bias.double()

    x64 = x.double()
    ref = linear(down, gate_reference(mlp.act, linear(gate, x64)) * linear(up, x64))
    torch.testing.assert_close(mlp(x).double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["swiglu", "aglu_glu", "nswish_glu", "leaky_relu2_glu", "xsilu_glu", "polyrelu_glu"])
def test_gated_mlp_gradcheck(act):
    """Input, the three matrices and the gate activation's own parameters (NSwish: eval mode, running statistics)."""
    torch.manual_seed(0)
    mlp = MLP(GPTConfig(n_embd=6, n_layer=2, n_head=2, act=act, glu_hidden=5), 0).double().eval()
    names = [n for n, _ in mlp.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in mlp.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(mlp, dict(zip(names, ps)), (x,))

    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, *params))


def test_leaky_relu2_gradcheck_and_values():
    act = activations.build("leaky_relu2")
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    torch.testing.assert_close(act(x), torch.tensor([1.0, 0.0625, 0.0, 0.25, 9.0], dtype=torch.float64))
    assert torch.autograd.gradcheck(act, (torch.randn(20, dtype=torch.float64, requires_grad=True),))
    assert torch.autograd.gradgradcheck(act, (torch.randn(20, dtype=torch.float64, requires_grad=True),))


def test_telemetry_reads_the_gate_and_the_gated_product():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, act="swiglu"), seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0) if p.dim() == 2 else None  # past init: wider pre-activations, a non-trivial sparsity
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    inputs = []
    handle = model.transformer.h[0].mlp.register_forward_hook(lambda m, i, o: inputs.append(i[0].detach()))
    record = collect(model, x)
    handle.remove()
    mlp, h = model.transformer.h[0].mlp, inputs[0].double()
    z = h @ mlp.c_fc.weight.double().t() + mlp.c_fc.bias.double()
    product = z * torch.sigmoid(z) * (h @ mlp.c_up.weight.double().t() + mlp.c_up.bias.double())
    layer = record["layers"][0]
    assert layer["kind"] == "SiLU" and layer["name"] == "transformer.h.0.mlp.act"
    assert layer["rho"] == pytest.approx((z * torch.sigmoid(z)).var(correction=0).item() / z.var(correction=0).item(),
                                         rel=1e-4)
    assert layer["product_sparsity"] == pytest.approx((product.abs() < 1e-2).double().mean().item(), abs=2e-3)
    assert 0 < layer["product_sparsity"] < 1
    plain = GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32), seed=0)
    assert "product_sparsity" not in collect(plain, x)["layers"][0]


@pytest.mark.parametrize("act", ["swiglu", "geglu", "reglu", "aglu_glu", "nswish_glu"])
def test_each_gated_name_learns_and_states_its_parameters(tmp_path, act, capsys):
    data = write_corpus(tmp_path / "data")
    model = train_in_process(args(data, tmp_path / "out", max_steps=40, eval_interval=20, act=act))
    _, val = train_losses(tmp_path / "out")
    assert val[-1] < val[0] - 1.0, val  # from ~ln(64) = 4.16 down, as the plain MLP in tests/test_train_gpt2.py
    counts = model.param_counts()
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["environment"]["params"] == counts and counts["mlp_per_layer"] == n_params(model.transformer.h[0].mlp)
    assert f"{counts['total'] / 1e6:.2f}M parameters" in capsys.readouterr().out
    ckpt = load_checkpoint(tmp_path / "out", kind="gpt2")
    assert ckpt["model_config"]["act"] == act and GPT.from_checkpoint(ckpt).transformer.h[0].mlp.c_up is not None


def test_gated_resume_is_exact_and_old_checkpoints_still_resume(tmp_path):
    data = write_corpus(tmp_path / "data")
    extra = dict(act="aglu_glu", glu_hidden=48)
    train_in_process(args(data, tmp_path / "straight", **extra))  # checkpoints at steps 4 and 8
    (tmp_path / "split").mkdir()
    shutil.copy(tmp_path / "straight" / "model_00004.pt", tmp_path / "split")
    train_in_process(args(data, tmp_path / "split", resume="true", **extra))
    assert train_losses(tmp_path / "split")[0] == train_losses(tmp_path / "straight")[0][4:]
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert a["transformer.h.0.mlp.c_up.weight"].shape == (48, 32) and all(torch.equal(a[k], b[k]) for k in a)
    # a checkpoint written before glu_hidden existed resumes, and loads as a plain MLP
    train_in_process(args(data, tmp_path / "old", max_steps=4))
    path = tmp_path / "old" / "model_00004.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["model_config"]["glu_hidden"]
    save_checkpoint(ckpt, tmp_path / "old", 4)
    model = train_in_process(args(data, tmp_path / "old", resume="true", resume_changes="max_steps"))  # 4 -> 8
    assert model.transformer.h[0].mlp.c_up is None and len(train_losses(tmp_path / "old")[0]) == 8


@pytest.mark.parametrize("kind", ["gpt2", "translation"])
def test_gated_checkpoints_of_the_old_width_rule_still_load(tmp_path, kind):
    """glu_hidden 0 meant 2/3 rounded to 64 until the rule matched the plain MLP's parameters: at d 32 that was 64
    wide, now 85 (GPT-2, 4 d) and 42 (ffn_dim 64). The checkpoint's weights say which: it loads at its width."""
    if kind == "gpt2":
        cls, config = GPT, GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, act="swiglu")
    else:
        cls, config = Transformer, TranslationConfig(vocab_size=20, enc_layers=1, dec_layers=1, d_model=32, ffn_dim=64,
                                                     act="swiglu")
    old = cls(dataclasses.replace(config, glu_hidden=64), seed=0)
    save_checkpoint({"kind": kind, "model": old.state_dict(), "model_config": dataclasses.asdict(config), "step": 1},
                    tmp_path / "old", 1)
    ckpt = load_checkpoint(tmp_path / "old", kind)
    assert ckpt["model_config"]["glu_hidden"] == 64
    assert all(torch.equal(a, b) for a, b in zip(cls.from_checkpoint(ckpt).state_dict().values(),
                                                 old.state_dict().values()))
    today = cls(config, seed=0)  # today's rule: glu_hidden stays 0
    save_checkpoint({"kind": kind, "model": today.state_dict(), "model_config": dataclasses.asdict(config), "step": 1},
                    tmp_path / "today", 1)
    assert load_checkpoint(tmp_path / "today", kind)["model_config"]["glu_hidden"] == 0


def test_init_from_needs_the_same_mlp_form(tmp_path, capsys):
    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "plain", max_steps=2))
    message = cli_error(args(data, tmp_path / "to_gated", act="swiglu", init_from=tmp_path / "plain"))
    assert "\n" not in message and "its MLP is plain (act gelu) and this run's is gated (act swiglu)" in message
    train_in_process(args(data, tmp_path / "gated", max_steps=2, act="swiglu"))
    model = train_in_process(args(data, tmp_path / "to_aglu", max_steps=0, act="aglu_glu", init_from=tmp_path / "gated"))
    assert "activation swiglu -> aglu_glu: MLP weights kept" in capsys.readouterr().out
    source = final_weights(tmp_path / "gated", 2)
    assert torch.equal(model.state_dict()["transformer.h.1.mlp.c_up.weight"], source["transformer.h.1.mlp.c_up.weight"])


def test_gated_checkpoint_scores_hellaswag_and_samples(make_checkpoint, hellaswag_file, gpt2_enc, capsys):
    import sample
    from eval import hellaswag

    ckpt = make_checkpoint(act="swiglu", vocab_size=50257, block_size=64)
    hellaswag.main([str(ckpt), "--data", str(hellaswag_file(n=4)), "--device", "cpu"])
    assert capsys.readouterr().out.splitlines()[0].endswith("| act swiglu")
    sample.main([str(ckpt), "--prompt", "Hello", "--max-new-tokens", "5", "--num-samples", "1", "--device", "cpu"])
    assert capsys.readouterr().out.startswith("Hello")


def test_gated_translation_model_learns():
    """A tiny encoder-decoder with a SwiGLU FFN learns to copy: the FFN's gate and up paths train together."""
    torch.manual_seed(0)
    model = Transformer(TranslationConfig(vocab_size=20, enc_layers=2, dec_layers=2, d_model=32, ffn_dim=96, n_head=4,
                                          dropout=0.0, act="swiglu", norm="postln"), seed=0)
    assert model.encoder[0].ffn.fc_up.out_features == 64 and model.param_counts()["mlp_per_layer"] == 3 * 32 * 64 + 160
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(120):
        x = torch.randint(4, 20, (32, 5), generator=g)
        src, tgt_in = torch.cat([x, torch.full((32, 1), 3)], 1), torch.cat([torch.full((32, 1), 2), x], 1)
        loss = model.loss(model(src, tgt_in), torch.cat([x, torch.full((32, 1), 3)], 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 2.5 and sum(losses[-10:]) / 10 < 0.5, (losses[0], losses[-10:])


def test_translation_trainer_runs_a_gated_ffn(tmp_path, capsys):
    """NSwish on the gate, per-token statistics, plain SiLU gate in the top FFN: the checkpoint and run.json say so,
    and the start line that d 32 is too small for a gated FFN of the plain one's parameters within 0.5%."""
    from test_parallel_data import write_corpus as write_parallel
    from test_train_translation import args as translation_args

    out = tmp_path / "run"
    train_translation.main(translation_args(write_parallel(tmp_path / "corpus"), out, tmp_path / "spm", "--act",
                                            "nswish_glu", "--max-steps", "4", "--test-at-end", "false"))
    ckpt = load_checkpoint(out, kind="translation")
    model = Transformer.from_checkpoint(ckpt)
    ffn, top = model.encoder[0].ffn, model.encoder[-1].ffn
    assert ckpt["model_config"]["act"] == "nswish_glu" and ffn.fc_up.out_features == 42  # d 32, ffn_dim 64
    assert " | gated MLP 42 wide: -1.05% parameters against the plain 64 | act nswish_glu" in capsys.readouterr().out
    assert (type(ffn.act).__name__, type(top.act).__name__) == ("NSwish", "SiLU")
    params = json.loads((out / "run.json").read_text())["environment"]["params"]
    assert params == model.param_counts() and params["mlp_per_layer"] == n_params(ffn)
    telemetry = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                 if "telemetry" in line][-1]["telemetry"]
    assert all("product_sparsity" in layer for layer in telemetry["layers"])
