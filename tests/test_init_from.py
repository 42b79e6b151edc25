"""--init-from: training starts from a tiny transformers GPT-2 made here (a directory, or a hub id with "/"
read offline from the hub cache) or from a checkpoint (ours or nanoGPT's), with the activation swapped."""
import json

import pytest
import torch

from model import GPT, GPTConfig
from model_parts.transformers_layout import hf_to_nanoact
from test_train_gpt2 import VOCAB, args, train_in_process, write_corpus

transformers = pytest.importorskip("transformers")

HF_SHAPE = dict(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2)


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """A tiny GPT2LMHeadModel saved with save_pretrained (the layout of OpenAI's GPT-2 on the hub)."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_SHAPE)).eval()
    out = tmp_path_factory.mktemp("hf_gpt2")
    hf.save_pretrained(out)
    return out, hf


def corpus_and_args(tmp_path, **overrides):
    data = write_corpus(tmp_path / "data")
    return args(data, tmp_path / "run", **{"block_size": 128, "n_layer": 4, "n_embd": 64, **overrides})


def mlp_weights(state):
    return {k: v for k, v in state.items() if ".mlp.c_" in k}


def test_init_from_transformers_directory_keeps_weights_and_logits(tmp_path, hf_gpt2, capsys):
    hf_dir, hf = hf_gpt2
    model = train_in_process(corpus_and_args(tmp_path, max_steps=0) + ["--init-from", str(hf_dir)])
    assert (model.config.block_size, model.config.n_layer, model.config.n_embd) == (32, 2, 32)  # the source's
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(idx)[0], hf(idx).logits, rtol=1e-5, atol=1e-5)
    out = capsys.readouterr().out
    assert f"initialised from transformers GPT-2 {hf_dir}: activation gelu and its parameters kept; optimizer " \
           "starts fresh" in out
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["config"]["model"]["n_layer"] == 2 and run["config"]["init_from"] == str(hf_dir)


def test_swap_to_aglu_near_gelu_then_fine_tune_and_auto_resume(tmp_path, hf_gpt2, capsys):
    hf_dir, hf = hf_gpt2
    near_gelu = ["--act", "aglu", "--act-kwargs", '{"kappa_init": 1.702, "lam_init": 1.0}', "--init-from", str(hf_dir)]
    argv = corpus_and_args(tmp_path, max_steps=4, checkpoint_interval=2) + near_gelu
    model = train_in_process(argv)
    out = capsys.readouterr().out
    assert "activation gelu -> aglu: MLP weights kept, its parameters at their init; optimizer starts fresh" in out
    first = torch.load(tmp_path / "run" / "model_00002.pt", weights_only=True)
    assert first["model_config"]["act"] == "aglu" and first["model_config"]["n_layer"] == 2
    # an untrained copy: the MLP matrices are GPT-2's, AGLU starts at (1.702, 1), i.e. sigmoid-GELU
    start = train_in_process(corpus_and_args(tmp_path / "again", max_steps=0) + near_gelu)
    source = hf_to_nanoact(hf.state_dict())
    for k, v in mlp_weights(start.state_dict()).items():
        assert torch.equal(v, source[k]), k
    acts = [block.mlp.act for block in start.transformer.h]
    assert all(a.kappa.item() == pytest.approx(1.702) and a.lam.item() == 1.0 for a in acts)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # sigmoid-GELU is within 0.021 of GPT-2's tanh GELU: logits stay close
        assert (start.eval()(idx)[0] - hf(idx).logits).abs().max() < 0.05
    # the run continues its own checkpoint, not the source, and reaches the same weights as uninterrupted
    (tmp_path / "run" / "model_00004.pt").unlink()
    resumed = train_in_process(argv + ["--auto-resume"])
    out = capsys.readouterr().out
    assert "not read: the run resumes its own checkpoint" in out and "resuming" in out
    for k, v in model.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0)


def test_init_from_a_nanogpt_checkpoint_with_another_activation(tmp_path, capsys):
    torch.manual_seed(1)
    source = GPT(GPTConfig(block_size=32, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, bias=False,
                           act="gelu_exact"), seed=1)
    ckpt = tmp_path / "out" / "ckpt.pt"
    ckpt.parent.mkdir()
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in source.state_dict().items()},
                "model_args": dict(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=VOCAB,
                                   dropout=0.0), "iter_num": 600, "best_val_loss": torch.tensor(3.0), "config": {}},
               ckpt)
    model = train_in_process(corpus_and_args(tmp_path, max_steps=0) + ["--init-from", str(ckpt.parent),
                                                                       "--act", "nswish"])
    assert model.config.bias is False and model.config.act == "nswish"
    for k, v in mlp_weights(source.state_dict()).items():
        assert torch.equal(model.state_dict()[k], v), k
    out = capsys.readouterr().out
    assert "recognised a nanoGPT checkpoint (iter 600, bias=False)" in out
    assert "activation gelu_exact -> nswish: MLP weights kept" in out


@pytest.mark.parametrize("parametrization", [{}, dict(param="completep", base_width=16, base_depth=1),
                                             dict(pos_emb="rope")])
def test_init_from_our_checkpoint_keeps_the_learned_activation(tmp_path, make_checkpoint, capsys, parametrization):
    """A completep source stays completep (its multipliers are part of its function), a rope source rope (it has
    no position table to load), in a run that names neither."""
    path = make_checkpoint(act="aglu", vocab_size=VOCAB, block_size=32, **parametrization)
    source = torch.load(path, weights_only=True)["model"]
    model = train_in_process(corpus_and_args(tmp_path, max_steps=0) + ["--init-from", str(path), "--act", "aglu"])
    for k, v in source.items():
        assert torch.equal(model.state_dict()[k], v), k
    config = {k: getattr(model.config, k) for k in ("param", "base_width", "base_depth", "pos_emb")}
    assert config == {"param": "sp", "base_width": 0, "base_depth": 0, "pos_emb": "learned", **parametrization}
    assert "activation aglu and its parameters kept" in capsys.readouterr().out


@pytest.mark.long
def test_hub_ids_with_a_slash_load_offline_from_the_cache(tmp_path, hf_gpt2, monkeypatch):
    """GPT.from_pretrained("openai-community/gpt2") used to be refused for its "/"; here it comes from a hub
    cache laid out as huggingface_hub writes it, with HF_HUB_OFFLINE=1."""
    from huggingface_hub import constants

    from errors import CheckpointNotFound

    hf_dir, hf = hf_gpt2
    snapshot = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in hf_dir.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    # in this process (a child's transformers import cost seconds): huggingface_hub reads both variables once, at
    # its import, into these constants, which it and transformers look up at each call
    for name, value in (("HF_HUB_OFFLINE", True), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(constants, name, value)
    with torch.no_grad():
        loaded = GPT.from_pretrained("openai-community/gpt2").eval()(torch.arange(8)[None])[0].sum().item()
        assert loaded == pytest.approx(hf(torch.arange(8)[None]).logits.sum().item(), rel=1e-4)
    with pytest.raises(CheckpointNotFound, match="^someone/none: no transformers GPT-2 there"):
        GPT.from_pretrained("someone/none")


def test_bad_init_from_is_one_line(tmp_path):
    from test_train_gpt2 import cli_error
    message = cli_error(corpus_and_args(tmp_path) + ["--init-from", str(tmp_path / "nothing_here.pt")])
    assert "nothing_here.pt" in message and "\n" not in message


def test_resume_in_a_build_nanogpt_log_directory_points_to_init_from(tmp_path):
    from test_foreign_checkpoints import build_nanogpt_file, source_model
    from test_train_gpt2 import cli_error

    path = build_nanogpt_file(tmp_path, source_model(vocab_size=VOCAB, block_size=32))
    message = cli_error(corpus_and_args(tmp_path) + ["--out-dir", str(path.parent), "--resume"])
    assert "cannot be resumed exactly; start from its weights with --init-from" in message
