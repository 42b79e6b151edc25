"""sample.py: text from a checkpoint, a run directory or a transformers GPT-2 directory."""
import pytest
import torch

import sample
from sample import SEPARATOR


def run(argv, capsys):
    sample.main(argv)
    out, err = capsys.readouterr()
    return out.split(SEPARATOR + "\n")[:-1], err


def test_samples_from_a_run_directory_are_seeded_and_cache_independent(make_checkpoint, gpt2_enc, capsys, tmp_path):
    ckpt = make_checkpoint(vocab_size=50257, block_size=16)
    common = ["--max-new-tokens", "20", "--num-samples", "2", "--device", "cpu"]  # 20 + prompt > block_size 16
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Hello, I'm a language model,")
    texts, err = run([str(ckpt.parent), "--prompt-file", str(prompt), *common], capsys)
    assert len(texts) == 2 and all(t.startswith("Hello, I'm a language model,") for t in texts)
    assert texts[0] != texts[1] and "40 new tokens in" in err and "kv cache on" in err
    again, _ = run([str(ckpt), "--prompt", "Hello, I'm a language model,", *common], capsys)
    assert again == texts
    greedy = [run([str(ckpt), "--prompt", "The", "--top-k", "1", *common, *cache], capsys)[0]
              for cache in ([], ["--no-kv-cache"])]
    assert greedy[0] == greedy[1]


def test_transformers_directory_samples_greedily_as_transformers_does(tmp_path, gpt2_enc, capsys):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(8.0)  # random weights with decided preferences: greedy choices not down to rounding
    hf.save_pretrained(tmp_path / "hf")
    prompt = "The quick brown fox"
    texts, _ = run([str(tmp_path / "hf"), "--prompt", prompt, "--top-k", "1", "--num-samples", "1",
                    "--max-new-tokens", "12", "--device", "cpu"], capsys)
    ids = torch.tensor([gpt2_enc.encode(prompt)])
    expected = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=50256)
    assert texts == [gpt2_enc.decode(expected[0].tolist()) + "\n"]


def test_bad_input_is_one_line(make_checkpoint, gpt2_enc, tmp_path):
    with pytest.raises(SystemExit, match=r"a 96-token vocabulary .*GPT-2's 50257 BPE tokens only"):
        sample.main([str(make_checkpoint(vocab_size=96)), "--device", "cpu"])
    with pytest.raises(SystemExit, match="missing.txt: cannot read the prompt file"):
        sample.main([str(make_checkpoint(vocab_size=50257)), "--prompt-file", str(tmp_path / "missing.txt"),
                     "--device", "cpu"])
    with pytest.raises(SystemExit, match="no such checkpoint file"):
        sample.main([str(tmp_path / "model_00100.pt")])
    with pytest.raises(SystemExit, match="the prompt has 21 tokens, the model's context is 16; shorten it"):
        sample.main([str(make_checkpoint(vocab_size=50257, block_size=16)), "--prompt", "Hello " * 20,
                     "--device", "cpu"])


def test_a_failure_in_generation_keeps_its_traceback(make_checkpoint, gpt2_enc, monkeypatch):
    """A RuntimeError of torch's (here a stand-in for a CUDA error) is no bad input: it is not cut to one line."""
    def device_side_assert(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(sample.GPT, "generate", device_side_assert)
    with pytest.raises(RuntimeError, match="device-side assert") as e:
        sample.main([str(make_checkpoint(vocab_size=50257)), "--device", "cpu"])
    assert e.traceback[-1].name == "device_side_assert"
