"""export/to_transformers.py: exported transformers models give our logits (GPT2LMHeadModel for GPT-2's own
activations, remote code copied from model.py and activations/ for every other registered activation), and bad
input fails clearly."""
import functools
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

import activations
from export import to_transformers
from model import GPT
from training.checkpoint import load_checkpoint

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT.parent / "shared" / "assets" / "tokenizer"


@pytest.fixture(autouse=True)
def tiktoken_gpt2(gpt2_enc):
    """Every export writes GPT-2's tokenizer from tiktoken's ranks: these tests need its offline cache."""


@pytest.fixture(autouse=True, scope="module")
def tokenizer_files_written_once(tmp_path_factory):
    """~45 exports here write the same tokenizer files (~0.15 CPU-s each, transformers' tokenizer.json): the first
    export of given (vocab, merges, model_max_length) runs save_gpt2_tokenizer, the others get a copy of its files,
    byte for byte what it writes. A vocabulary of other objects (OpenAI's files) is written anew."""
    from export import tokenizer

    save, written = tokenizer.save_gpt2_tokenizer, {}

    def save_once(out_dir, vocab, merges, model_max_length):
        key = (id(vocab), id(merges), model_max_length)
        if key not in written:
            first = tmp_path_factory.mktemp("tokenizer")
            save(first, vocab, merges, model_max_length)
            written[key] = (first, vocab, merges)  # the objects kept alive: their ids stay theirs
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for f in written[key][0].iterdir():
            shutil.copyfile(f, Path(out_dir) / f.name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokenizer, "save_gpt2_tokenizer", save_once)
        yield


def exported_logits_match(ckpt, out_dir, trust_remote_code=False, steps=0):
    """Max |our logits - exported model's logits| over the 50257 real tokens, and the loaded model."""
    from transformers import AutoModelForCausalLM

    ours = GPT.from_checkpoint(load_checkpoint(ckpt, kind="gpt2"))
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
    running statistics moved by training steps and alpha set away from 0."""
    from training.checkpoint import load_checkpoint, save_checkpoint
    from model import GPT, GPTConfig

    path = make_checkpoint(act=act, **overrides)
    ckpt = load_checkpoint(path)
    model = GPT(GPTConfig(**ckpt["model_config"]), seed=0)
    model.load_state_dict(ckpt["model"])
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randint(0, 50257, (2, 24)))
            activations.step_statistics(model)
        for name, p in model.named_parameters():
            if name.endswith("act.alpha"):
                p.fill_(0.7)
    ckpt["model"] = model.state_dict()
    return save_checkpoint(ckpt, path.parent, ckpt["step"] + 1)


GPT2_NAMES = {"gelu", "gelu_exact", "relu", "relu2", "silu", "swish"}  # GPT-2 has these: GPT2LMHeadModel
EVERY_ACTIVATION = [(name, {}) for name in activations.available()] + [
    ("aglu", {"act_kwargs": {"channelwise": True, "num_channels": 128}}),
    ("nswish", {"plain_top_k": 1}),  # NSwish below, plain SiLU in the top layer
    ("nswish", {"act_kwargs": {"per_instance": True}}),
    ("nswish", {"act_kwargs": {"per_instance": True}, "plain_top_k": 1}),
    ("nrelu", {"plain_top_k": 1}),
    ("nrelu", {"act_kwargs": {"per_instance": True}}),
]


def assert_remote_code_is_self_contained(out):
    """transformers copies exactly our files, also the versions before 5.x that copy only the modeling file's
    own relative imports, and they import only torch, transformers and the standard library: they load
    without nanoact installed."""
    from transformers.dynamic_module_utils import get_imports, get_relative_imports

    modeling = out / "modeling_nanoact.py"
    assert set(out.glob("*.py")) == {modeling, *(out / f"{name}.py" for name in get_relative_imports(modeling))}
    for source in out.glob("*.py"):
        assert set(get_imports(source)) <= {"torch", "transformers", *sys.stdlib_module_names}, source.name


def assert_copied_from_the_real_sources(out):
    """The wrapper, model.py and the activation files are the repository's own, only their imports made relative."""
    def code(path):
        return [line for line in path.read_text().splitlines() if not re.match(r"\s*(from|import) ", line)]

    copies = {out / "model.py": ROOT / "model.py", out / "activations.py": ROOT / "activations" / "__init__.py",
              out / "export_transformers_wrapper.py": ROOT / "export" / "transformers_wrapper.py"}
    copies.update({f: ROOT / "activations" / f"{f.stem.removeprefix('activations_')}.py"
                   for f in out.glob("activations_*.py")})
    assert {f.stem for f in out.glob("activations_*.py")} >= {"activations_aglu", "activations_anact", "activations_basic"}
    for copy, real in copies.items():
        assert code(copy) == code(real), copy.name


def case_id(case):
    act, overrides = case
    options = {**overrides.get("act_kwargs", {}), **{k: v for k, v in overrides.items() if k != "act_kwargs"}}
    return "-".join([act, *(f"{k}={v}" for k, v in options.items())])


# gated MLPs (activations/gated.py) have no GPT2LMHeadModel form: remote code, a plain gate activation included
GATED = [("swiglu", {}), ("aglu_glu", {}), ("nswish_glu", {"plain_top_k": 1}), ("reglu", {"glu_hidden": 48})]
# GPT2LMHeadModel has only LayerNorm: every other normalization (model.py NORMS) is remote code
NORMS = [("gelu", {"norm": "rmsnorm"}), ("gelu", {"norm": "dyt"}), ("relu", {"norm": "none"})]
# nor rotary positions
POSITIONS = [("gelu", {"pos_emb": "rope"})]


@pytest.mark.parametrize("act, overrides", [pytest.param(*case, id=case_id(case)) for case in
                                            EVERY_ACTIVATION + [("nswish", {"plain_top_k": 2})] + GATED + NORMS
                                            + POSITIONS])
def test_every_activation_exports_with_our_logits(make_checkpoint, tmp_path, act, overrides):
    ckpt = trained_stats_checkpoint(make_checkpoint, act, **overrides)
    out = tmp_path / "hf"
    plain = (act in GPT2_NAMES and not overrides) or overrides.get("plain_top_k") == 2  # every layer plain SiLU
    assert to_transformers.export(ckpt, out) == ("gpt2" if plain else "remote")
    diff, _, hf = exported_logits_match(ckpt, out, trust_remote_code=True)
    assert diff < 1e-5
    assert type(hf).__name__ == ("GPT2LMHeadModel" if plain else "NanoactForCausalLM")
    if not plain:
        assert_remote_code_is_self_contained(out)
        assert_copied_from_the_real_sources(out)


@pytest.mark.parametrize("act, kind", [("gelu", "gpt2"), ("aglu", "remote")])
def test_completep_exports_with_our_logits(make_checkpoint, tmp_path, act, kind):
    """m_width 2, m_depth 2, every bias and norm moved off its init: GPT2LMHeadModel gets the multipliers folded
    into q, c_proj and ln_f (export/to_transformers.py's sp_equivalent), remote code runs model.py's own completep forward."""
    from training.checkpoint import save_checkpoint

    path = make_checkpoint(act=act, param="completep", base_width=16, base_depth=1)
    ckpt = load_checkpoint(path)
    gen = torch.Generator().manual_seed(0)
    ckpt["model"] = {k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.dim() == 1 else v
                     for k, v in ckpt["model"].items()}
    ckpt = save_checkpoint(ckpt, path.parent, ckpt["step"] + 1)
    assert to_transformers.export(ckpt, tmp_path / "hf") == kind
    diff, ours, hf = exported_logits_match(ckpt, tmp_path / "hf", trust_remote_code=True)
    assert ours.config.param == "completep" and diff < 1e-4
    if kind == "remote":
        assert hf.config.param == "completep"


def test_remote_code_generates_like_our_greedy_loop(make_checkpoint, tmp_path):
    ckpt = trained_stats_checkpoint(make_checkpoint, "nswish", plain_top_k=1)
    to_transformers.export(ckpt, tmp_path / "hf")
    _, ours, hf = exported_logits_match(ckpt, tmp_path / "hf", trust_remote_code=True)
    stats = ours.transformer.h[0].mlp.act.telemetry()
    assert stats["rho"] != pytest.approx(0.313083, abs=1e-3) and stats["alpha"] == pytest.approx(0.7)
    idx = torch.randint(0, 50257, (1, 6), generator=torch.Generator().manual_seed(2))
    seq = idx
    for _ in range(5):
        seq = torch.cat([seq, ours(seq)[0][:, -1, :50257].argmax(-1, keepdim=True)], 1)
    got = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=5, do_sample=False)
    assert torch.equal(got, seq)


def test_remote_code_takes_left_and_right_padded_batches(make_checkpoint, tmp_path):
    """generate() and lm-eval pad on the left: each row scores and generates as it does alone."""
    ckpt = make_checkpoint(act="aglu")
    to_transformers.export(ckpt, tmp_path / "hf")
    _, ours, hf = exported_logits_match(ckpt, tmp_path / "hf", trust_remote_code=True)
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, 50257, (n,), generator=gen) for n in (7, 4, 2, 9)]
    ids, mask = torch.full((4, 9), 50256), torch.zeros(4, 9, dtype=torch.long)
    for i, (row, left) in enumerate(zip(rows, (2, 5, 3, 0))):  # row 2: pads on both sides
        ids[i, left:left + len(row)], mask[i, left:left + len(row)] = row, 1
    with torch.no_grad():
        logits = hf(ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = ours(row[None])[0][0, :, :50257]
            assert (logits[i][mask[i].bool()] - alone).abs().max() < 1e-5
        left_padded = ids.clone()
        left_padded[2], mask[2] = torch.cat([torch.full((7,), 50256), rows[2]]), (torch.arange(9) >= 7).long()
        got = hf.generate(left_padded, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=50256)
        for i, row in enumerate(rows):
            seq = row[None]
            for _ in range(4):
                seq = torch.cat([seq, ours(seq)[0][:, -1, :50257].argmax(-1, keepdim=True)], 1)
            assert torch.equal(got[i, 9:], seq[0, len(row):])
        with pytest.raises(ValueError, match="one run between its left and right padding"):
            hf(ids, attention_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 1]] * 4))


def test_activation_registered_at_run_time_exports_with_no_change_to_export(make_checkpoint, tmp_path, monkeypatch):
    """Adding an activation = its file + a registration: export copies the file (tests/custom_activation.py,
    which itself imports from activations/) and registers the class by name in the remote code."""
    from custom_activation import TanhGate

    monkeypatch.setattr(activations, "_REGISTRY", dict(activations._REGISTRY))  # unregistered after the test
    activations.register("tanh_gate", TanhGate)
    ckpt = trained_stats_checkpoint(make_checkpoint, "tanh_gate", act_kwargs={"scale_init": 1.7})
    out = tmp_path / "hf"
    assert to_transformers.export(ckpt, out) == "remote"
    assert (out / "custom_activation.py").is_file()
    assert_remote_code_is_self_contained(out)
    diff, _, hf = exported_logits_match(ckpt, out, trust_remote_code=True)
    assert diff < 1e-5 and hf.gpt.transformer.h[1].mlp.act.scale.item() == pytest.approx(1.7)


@pytest.mark.skipif(not (TOKENIZER / "encoder.json").is_file(), reason="../shared GPT-2 tokenizer files not present")
def test_tokenizer_saved_from_openai_files_matches_tiktoken(make_checkpoint, tmp_path, gpt2_enc):
    from transformers import AutoTokenizer

    to_transformers.main([str(make_checkpoint()), str(tmp_path / "hf"), "--tokenizer-dir", str(TOKENIZER)])
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "Hello world! HellaSwag's [title] endings:  double  spaces, 1234 and ünïcödé."
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(text) == gpt2_enc.encode(text) and tok.eos_token_id == 50256


SHARED_TEXT = ROOT.parent / "shared" / "assets" / "text"


@pytest.mark.skipif(not (TOKENIZER / "encoder.json").is_file(), reason="../shared GPT-2 tokenizer files not present")
def test_tokenizer_from_tiktoken_ranks_is_openais(make_checkpoint, tmp_path):
    """The merges replayed from tiktoken's ranks are vocab.bpe line for line, so an export without
    --tokenizer-dir writes the same tokenizer files as one with OpenAI's."""
    from export.tokenizer import bpe_from_openai_files, bpe_from_tiktoken

    assert bpe_from_tiktoken() == bpe_from_openai_files(TOKENIZER)
    ckpt = make_checkpoint()
    to_transformers.main([str(ckpt), str(tmp_path / "a")])
    to_transformers.main([str(ckpt), str(tmp_path / "b"), "--tokenizer-dir", str(TOKENIZER)])
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "merges.txt").read_bytes() == (TOKENIZER / "vocab.bpe").read_bytes().replace(
        b"\r\n", b"\n").rstrip(b"\n") + b"\n"


@pytest.mark.skipif(not SHARED_TEXT.is_dir(), reason="../shared real text not present")
def test_exported_tokenizer_gives_tiktokens_ids_on_real_text(make_checkpoint, tmp_path, gpt2_enc):
    import gzip
    import json

    from transformers import AutoTokenizer

    to_transformers.main([str(make_checkpoint(block_size=96)), str(tmp_path / "hf")])
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (tok.bos_token_id, tok.eos_token_id, tok.model_max_length) == (50256, 50256, 96)
    texts = [f.read_text(encoding="utf-8")[:200_000] for f in sorted(SHARED_TEXT.rglob("*.txt"))]
    texts += [json.loads(line)["text"] for f in sorted(SHARED_TEXT.rglob("*.json.gz"))
              for line in gzip.open(f, "rt", encoding="utf-8")]
    texts.append("Grüße aus Köln — 東京 🙂\r\n\ttabs,   runs of spaces\u00a0and 12345678 digits.")
    assert len(texts) > 30
    for text in texts:
        ids = gpt2_enc.encode(text)
        assert tok.encode(text) == ids
        assert tok.decode(ids) == text
    assert tok.encode("a<|endoftext|>b") == gpt2_enc.encode("a<|endoftext|>b", allowed_special="all")


def test_clear_errors(make_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="no such checkpoint file"):
        to_transformers.main([str(tmp_path / "missing.pt"), str(tmp_path / "out")])
    torch.save({"kind": "translation", "model": {}}, tmp_path / "t.pt")
    with pytest.raises(SystemExit, match="a 'translation' checkpoint, but this command needs a 'gpt2' one"):
        to_transformers.main([str(tmp_path / "t.pt"), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="needs OpenAI's GPT-2 encoder.json and vocab.bpe"):
        to_transformers.main([str(make_checkpoint()), str(tmp_path / "out"), "--tokenizer-dir", str(tmp_path)])


def test_no_tiktoken_cache_is_one_line_before_any_file(make_checkpoint, tmp_path, monkeypatch):
    from data.tokenizer import TokenizerError
    from export import tokenizer

    def offline():
        raise TokenizerError("cannot load tiktoken's gpt2 encoding (ConnectionError); offline, point TIKTOKEN_CACHE_DIR")

    monkeypatch.setattr(tokenizer, "gpt2_tokenizer", offline)
    # an empty cache of its own for this test; the process's (the merges replayed once) comes back after it
    monkeypatch.setattr(tokenizer, "bpe_from_tiktoken", functools.cache(tokenizer.bpe_from_tiktoken.__wrapped__))
    with pytest.raises(SystemExit, match="error: cannot load tiktoken's gpt2 encoding"):
        to_transformers.main([str(make_checkpoint()), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


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
