"""build-nanogpt and nanoGPT checkpoints, written here in their real formats, load as data (no pickle runs)
and work where a checkpoint is accepted: GPT.from_checkpoint (sample.py, lm-eval, --init-from), HellaSwag, the export."""
import dataclasses
import json
import sys
import textwrap
import types

import pytest
import torch

from model import GPT, GPTConfig
from training.checkpoint import load_checkpoint
from training.foreign_checkpoints import ForeignCheckpointError

TINY = dict(block_size=64, n_layer=2, n_head=2, n_embd=32)


def source_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, "vocab_size": 50304, **overrides}), seed=seed).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)  # confident predictions, so that logits comparisons mean something
    return model


def build_nanogpt_file(tmp_path, model, step=5000, compiled=False, extra=""):
    """A log/model_NNNNN.pt exactly as build-nanogpt's train_gpt2.py writes it: its GPTConfig is a dataclass
    defined in the script's __main__, pickled by torch.save together with the state dict, step and val_loss."""
    weights = tmp_path / "weights.pt"
    state = model.state_dict()
    torch.save({("_orig_mod." if compiled else "") + k: v for k, v in state.items()}, weights)
    out = tmp_path / "log" / f"model_{step:05d}.pt"
    out.parent.mkdir(exist_ok=True)
    c = model.config
    script = textwrap.dedent(f"""
        import os
        from dataclasses import dataclass
        import torch

        @dataclass
        class GPTConfig:
            block_size: int = 1024
            vocab_size: int = 50257
            n_layer: int = 12
            n_head: int = 12
            n_embd: int = 768
        {textwrap.indent(extra, ' ' * 8).strip()}
        config = GPTConfig(block_size={c.block_size}, vocab_size={c.vocab_size}, n_layer={c.n_layer},
                           n_head={c.n_head}, n_embd={c.n_embd})
        checkpoint = {{'model': torch.load({str(weights)!r}, weights_only=True), 'config': config,
                       'step': {step}, 'val_loss': 3.2857}}
        torch.save(checkpoint, {str(out)!r})
    """)
    # run as build-nanogpt's __main__ (pickle records the class as __main__.GPTConfig), in this process: a fresh
    # module stands in for __main__ while the script runs, and pickling only records what unpickling would call
    saved, sys.modules["__main__"] = sys.modules["__main__"], types.ModuleType("__main__")
    try:
        exec(compile(script, "build_nanogpt_train_gpt2.py", "exec"), sys.modules["__main__"].__dict__)
    finally:
        sys.modules["__main__"] = saved
    return out


def nanogpt_file(tmp_path, model, iter_num=2000, flash=False):
    """out/ckpt.pt as nanoGPT's train.py writes it: `_orig_mod.` keys (compiled model), model_args, iter_num,
    best_val_loss (a tensor), its config dict and the optimizer's state; without flash, attn.bias mask buffers."""
    c = model.config
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    if not flash:
        mask = torch.tril(torch.ones(c.block_size, c.block_size)).view(1, 1, c.block_size, c.block_size)
        state.update({f"_orig_mod.transformer.h.{i}.attn.bias": mask for i in range(c.n_layer)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    optimizer.step()
    model_args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.block_size, bias=c.bias,
                      vocab_size=c.vocab_size, dropout=0.0)
    config = dict(out_dir="out", eval_interval=2000, init_from="scratch", dataset="openwebtext", batch_size=12,
                  learning_rate=6e-4, betas=None, wandb_log=False, compile=True)
    out = tmp_path / "out" / "ckpt.pt"
    out.parent.mkdir(exist_ok=True)
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "model_args": model_args, "iter_num": iter_num,
                "best_val_loss": torch.tensor(2.95), "config": config}, out)
    return out


def logits(model, seed=1):
    idx = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(idx)[0]


def test_build_nanogpt_checkpoint_loads_as_data_with_its_logits(tmp_path, capsys):
    source = source_model(act="gelu")
    path = build_nanogpt_file(tmp_path, source, compiled=True)  # the lm-eval test below takes plain keys
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == ["__main__.GPTConfig"]
    ckpt = load_checkpoint(path.parent, kind="gpt2")  # the run directory: its newest model_*.pt
    model = GPT.from_checkpoint(ckpt)
    assert ckpt["step"] == 5000 and ckpt["val_loss"] == pytest.approx(3.2857)
    assert ckpt["model_config"] == {**TINY, "vocab_size": 50304, "dropout": 0.0, "bias": True, "act": "gelu",
                                    "act_kwargs": {}, "plain_top_k": 0}
    torch.testing.assert_close(logits(model), logits(source), rtol=0, atol=0)
    line = capsys.readouterr().out.strip()
    assert "recognised a build-nanogpt checkpoint (step 5000)" in line and "\n" not in line


@pytest.mark.parametrize("flash", [False, True])
def test_nanogpt_checkpoint_without_biases_loads_with_exact_gelu(tmp_path, capsys, flash):
    source = source_model(act="gelu_exact", bias=False, vocab_size=50257)
    path = nanogpt_file(tmp_path, source, flash=flash)
    ckpt = load_checkpoint(path.parent, kind="gpt2")  # nanoGPT's out_dir holds ckpt.pt, no model_*.pt
    model = GPT.from_checkpoint(ckpt)
    assert ckpt["step"] == 2000 and ckpt["val_loss"] == pytest.approx(2.95)
    assert ckpt["model_config"]["act"] == "gelu_exact" and ckpt["model_config"]["bias"] is False
    assert ckpt["config"]["dataset"] == "openwebtext"
    torch.testing.assert_close(logits(model), logits(source), rtol=0, atol=0)
    assert "recognised a nanoGPT checkpoint (iter 2000, bias=False)" in capsys.readouterr().out


def test_our_checkpoints_are_not_taken_for_foreign_ones(make_checkpoint, capsys):
    ckpt = load_checkpoint(make_checkpoint(step=3))
    assert ckpt["kind"] == "gpt2" and "source" not in ckpt and "recognised" not in capsys.readouterr().out


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    extra = f"""
        class Payload:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        _init = GPTConfig.__init__
        def __init__(self, *a, **k):
            _init(self, *a, **k)
            self.payload = Payload()
        GPTConfig.__init__ = __init__
    """
    path = build_nanogpt_file(tmp_path, source_model(), extra=textwrap.dedent(extra))
    with pytest.raises(ForeignCheckpointError, match=r"cannot be read as data .*system") as e:
        load_checkpoint(path, kind="gpt2")
    assert "\n" not in str(e.value) and not marker.exists()


def test_layout_mismatches_and_wrong_kind_are_one_line(tmp_path):
    source = source_model()
    path = nanogpt_file(tmp_path, source)
    state = torch.load(path, weights_only=True)
    state["model_args"]["n_embd"] = 64
    torch.save(state, path)
    with pytest.raises(ForeignCheckpointError, match=r"do not fit a GPT-2 with its config \(wrong shapes"):
        load_checkpoint(path, kind="gpt2")
    state["model_args"]["n_embd"] = 32
    state["model"]["_orig_mod.lm_head.weight"] = state["model"]["_orig_mod.lm_head.weight"] + 1
    torch.save(state, path)
    with pytest.raises(ForeignCheckpointError, match="untied embeddings"):
        load_checkpoint(path, kind="gpt2")
    with pytest.raises(ForeignCheckpointError, match="needs a 'translation' one"):
        load_checkpoint(path, kind="translation")


def test_foreign_checkpoints_score_export_and_evaluate(tmp_path, hellaswag_file, gpt2_enc):
    from eval import hellaswag
    from export import to_transformers
    from transformers import GPT2LMHeadModel

    source = source_model(act="gelu_exact", bias=False, vocab_size=50257)
    path = nanogpt_file(tmp_path, source)
    data = hellaswag_file(6)
    out = tmp_path / "h.json"
    hellaswag.main([str(path), "--data", str(data), "--device", "cpu", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["step"] == 2000 and record["act"] == "gelu_exact" and record["results"]["completion"]["n"] == 6
    assert to_transformers.export(path, tmp_path / "hf") == "gpt2"  # exact GELU is GPT-2's "gelu"
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, logits(source), rtol=1e-4, atol=1e-4)


def test_build_nanogpt_checkpoint_in_the_lm_eval_model(tmp_path):
    pytest.importorskip("lm_eval")
    from eval.lm_eval_model import NanoactLM

    source = source_model()
    lm = NanoactLM(checkpoint=str(build_nanogpt_file(tmp_path, source)), device="cpu", batch_size=2)
    torch.testing.assert_close(logits(lm.model), logits(source), rtol=0, atol=0)
    assert dataclasses.asdict(lm.model.config)["act"] == "gelu"
