"""GPT-2's normalization as a model option (model.py NORMS): each one against its paper's formula in float64,
in every place GPT-2 normalises, through checkpoints, resume and --init-from."""
import pytest
import torch

from errors import ConfigError
from model import GPT, NORMS, GPTConfig, DyT
from test_train_gpt2 import args, cli_error, train_in_process, write_corpus
from training.checkpoint import load_checkpoint

TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)


def reference(norm, x, module):
    """The definitions in float64: LayerNorm, RMSNorm (Zhang & Sennrich 2019, Eq. 4), DyT (Zhu et al. 2025, Eq. 1)."""
    x = x.double()
    params = {k: v.detach().double() for k, v in module.named_parameters()}
    if norm == "layernorm":
        y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, correction=0, keepdim=True) + 1e-5)
        return y * params["weight"] + params["bias"]
    if norm == "rmsnorm":
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-5) * params["weight"]
    if norm == "dyt":
        return torch.tanh(params["alpha"] * x) * params["weight"] + params["bias"]
    return x


@pytest.mark.parametrize("norm", list(NORMS))
def test_every_norm_of_the_model_is_its_definition(norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, norm=norm), seed=0)
    modules = [model.transformer.ln_f] + [b.ln_1 for b in model.transformer.h] + [b.ln_2 for b in model.transformer.h]
    x = 3 * torch.randn(4, 16) + 1
    for m in modules:
        with torch.no_grad():  # away from the init, so that weight, bias and alpha all count
            for p in m.parameters():
                p.add_(0.3 * torch.randn_like(p))
        assert torch.allclose(m(x).double(), reference(norm, x, m), atol=1e-5)
    logits, loss = model(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    assert torch.isfinite(loss) and logits.shape == (2, 16, 64)
    norm_keys = [k for k in model.state_dict() if ".ln_" in k or "ln_f" in k]
    assert bool(norm_keys) == (norm != "none")


def test_dyt_gradients_match_float64_autograd():
    torch.manual_seed(0)
    m = DyT(5).double()
    with torch.no_grad():
        m.weight.add_(torch.randn(5, dtype=torch.float64))
        m.bias.add_(torch.randn(5, dtype=torch.float64))
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: m(x), (x, *m.parameters()))
    assert m.alpha.item() == 0.5 and m.alpha.dim() == 0  # the paper's alpha_0; 0-D, so never weight-decayed


def test_dyt_starts_at_the_configured_alpha():
    model = GPT(GPTConfig(**TINY, norm="dyt", dyt_alpha=2.0), seed=0)
    assert {m.alpha.item() for m in model.modules() if isinstance(m, DyT)} == {2.0}


def test_unknown_norm_is_one_line_error():
    with pytest.raises(ConfigError, match="unknown norm 'batchnorm'; choose one of layernorm, rmsnorm, dyt, none"):
        GPT(GPTConfig(**TINY, norm="batchnorm"), seed=0)


@pytest.mark.long
def test_a_dyt_run_trains_resumes_and_is_read_back(tmp_path):
    """--norm is a model option like --act: in the checkpoint, refused on a resume with another one, read back by
    GPT.from_checkpoint; --init-from takes the source's norm, as it takes its shape."""
    data = write_corpus(tmp_path / "data")
    train_in_process(args(data, tmp_path / "run", act="xsilu", norm="dyt", max_steps=4))
    ckpt = load_checkpoint(tmp_path / "run", kind="gpt2")
    assert ckpt["model_config"]["norm"] == "dyt"
    model = GPT.from_checkpoint(ckpt)
    assert model.transformer.h[0].ln_1.alpha.item() != 0.5  # trained
    error = cli_error(args(data, tmp_path / "run", norm="rmsnorm", max_steps=6, resume="true"))
    assert "model config" in error and "resume with the same model options" in error
    train_in_process(args(data, tmp_path / "tuned", init_from=str(tmp_path / "run"), max_steps=1))
    assert load_checkpoint(tmp_path / "tuned", kind="gpt2")["model_config"]["norm"] == "dyt"
