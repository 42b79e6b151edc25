"""export/to_transformers.py: exported transformers models give our logits (GPT2LMHeadModel for GPT-2's own
activations, standalone remote code for AGLU/NSwish/NReLU), and bad input fails clearly."""
import re
from pathlib import Path

import pytest
import torch

from export import to_transformers
from training.checkpoint import load_gpt

transformers = pytest.importorskip("transformers")
TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "assets" / "tokenizer"


def exported_logits_match(ckpt, out_dir, trust_remote_code=False, steps=0):
    """Max |our logits - exported model's logits| over the 50257 real tokens, and the loaded model."""
    from transformers import AutoModelForCausalLM

    ours, _ = load_gpt(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=trust_remote_code).eval()
    idx = torch.randint(0, 50257, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(idx)[0][..., :50257] - hf(idx).logits).abs().max().item()
    return diff, ours, hf


@pytest.mark.parametrize("act, hf_act", [("gelu", "gelu_new"), ("gelu_exact", "gelu"), ("relu", "relu"),
                                         ("relu2", "relu2"), ("silu", "silu")])
def test_gpt2_activations_export_as_plain_gpt2(make_checkpoint, tmp_path, act, hf_act):
    ckpt = make_checkpoint(act=act)
    assert to_transformers.export(ckpt, tmp_path / "hf") == "gpt2"
    assert not list((tmp_path / "hf").glob("*.py"))
    diff, _, hf = exported_logits_match(ckpt, tmp_path / "hf")
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.config.activation_function == hf_act
    assert hf.config.vocab_size == 50257 and diff < 1e-5


def test_bias_free_model_exports_with_zero_biases(make_checkpoint, tmp_path):
    ckpt = make_checkpoint(bias=False)
    to_transformers.export(ckpt, tmp_path / "hf")
    assert exported_logits_match(ckpt, tmp_path / "hf")[0] < 1e-5


def trained_stats_checkpoint(make_checkpoint, act, **overrides):
    """A checkpoint whose activations hold non-default values: AGLU's kappa/lam drawn at init, ANAct's
    running statistics moved by training-mode forwards and alpha set away from 0."""
    from training.checkpoint import load_checkpoint, save_checkpoint
    from model import GPT, GPTConfig

    path = make_checkpoint(act=act, **overrides)
    ckpt = load_checkpoint(path)
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randint(0, 50257, (2, 24)))
        for name, p in model.named_parameters():
            if name.endswith("act.alpha"):
                p.fill_(0.7)
    ckpt["model"] = model.state_dict()
    return save_checkpoint(ckpt, path.parent, ckpt["step"] + 1)


@pytest.mark.parametrize("act, overrides", [
    ("aglu", {}),
    ("aglu", {"act_kwargs": {"channelwise": True, "num_channels": 128}}),
    ("nswish", {"plain_top_k": 1}),  # NSwish below, plain SiLU in the top layer
    ("nrelu", {"act_kwargs": {"per_instance": True}}),
])
def test_learned_activations_export_with_standalone_remote_code(make_checkpoint, tmp_path, act, overrides):
    ckpt = trained_stats_checkpoint(make_checkpoint, act, **overrides)
    out = tmp_path / "hf"
    assert to_transformers.export(ckpt, out) == "remote"
    for source in out.glob("*.py"):  # runs without nanoact installed: imports only torch/transformers/itself
        imports = re.findall(r"^(?:from|import) (\S+)", source.read_text(), re.M)
        assert set(imports) <= {"torch", "torch.nn", "torch.nn.functional", "transformers",
                                "transformers.modeling_outputs", ".configuration_nanoact"}, imports
    diff, ours, hf = exported_logits_match(ckpt, out, trust_remote_code=True)
    assert type(hf).__name__ == "NanoactForCausalLM" and diff < 1e-5
    if act == "nswish":
        stats = ours.transformer.h[0].mlp.act.telemetry()
        assert stats["rho"] != pytest.approx(0.313083, abs=1e-3) and stats["alpha"] == pytest.approx(0.7)
        # greedy generation through transformers' generate() equals our own greedy loop
        idx = torch.randint(0, 50257, (1, 6), generator=torch.Generator().manual_seed(2))
        seq = idx
        for _ in range(5):
            seq = torch.cat([seq, ours(seq)[0][:, -1, :50257].argmax(-1, keepdim=True)], 1)
        got = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=5, do_sample=False)
        assert torch.equal(got, seq)


@pytest.mark.skipif(not (TOKENIZER / "encoder.json").is_file(), reason="../shared GPT-2 tokenizer files not present")
def test_tokenizer_saved_from_openai_files_matches_tiktoken(make_checkpoint, tmp_path, gpt2_enc):
    from transformers import AutoTokenizer

    to_transformers.main([str(make_checkpoint()), str(tmp_path / "hf"), "--tokenizer-dir", str(TOKENIZER)])
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "Hello world! HellaSwag's [title] endings:  double  spaces, 1234 and ünïcödé."
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(text) == gpt2_enc.encode(text) and tok.eos_token_id == 50256


def test_clear_errors(make_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="no such checkpoint file"):
        to_transformers.main([str(tmp_path / "missing.pt"), str(tmp_path / "out")])
    torch.save({"kind": "translation", "model": {}}, tmp_path / "t.pt")
    with pytest.raises(SystemExit, match="a 'translation' checkpoint, but this command needs a 'gpt2' one"):
        to_transformers.main([str(tmp_path / "t.pt"), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="needs OpenAI's GPT-2 encoder.json and vocab.bpe"):
        to_transformers.main([str(make_checkpoint()), str(tmp_path / "out"), "--tokenizer-dir", str(tmp_path)])


def test_exported_gpt2_evaluates_like_the_checkpoint(make_checkpoint, hellaswag_file, gpt2_enc, tmp_path):
    """--hf DIR (eval/hellaswag.py) and hf=DIR (lm-eval adapter) load the export and score as the original."""
    import json

    from eval import hellaswag
    from eval.lm_eval_model import NanoactLM
    from lm_eval.api.instance import Instance

    ckpt, data = make_checkpoint(), hellaswag_file(n=6)
    to_transformers.export(ckpt, tmp_path / "hf")
    hellaswag.main([str(ckpt), "--data", str(data), "--device", "cpu", "--out", str(tmp_path / "a.json")])
    hellaswag.main(["--hf", str(tmp_path / "hf"), "--data", str(data), "--device", "cpu"])
    ours = json.loads((tmp_path / "a.json").read_text())["results"]
    theirs = json.loads((tmp_path / "hf" / "hellaswag.json").read_text())["results"]
    for scoring in ("completion", "lm_eval"):
        assert ours[scoring]["correct"] == theirs[scoring]["correct"]
        assert ours[scoring]["correct_norm"] == theirs[scoring]["correct_norm"]
    request = [Instance(request_type="loglikelihood", doc={}, arguments=("The man picks up", " a knife"), idx=0)]
    a = NanoactLM(checkpoint=str(ckpt), device="cpu").loglikelihood(request)[0][0]
    b = NanoactLM(hf=str(tmp_path / "hf"), device="cpu").loglikelihood(request)[0][0]
    assert a == pytest.approx(b, abs=1e-4)
