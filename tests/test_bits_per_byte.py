"""Byte-level shards (data/fineweb.py --tokenizer bytes) and val bits per byte (data/bits_per_byte.py) in the trainer."""
import json
import math

import numpy as np
import pytest

import data.fineweb as fineweb
from data.bits_per_byte import validation_bytes
from data.loader import ShardLoader, shards_tokenizer
from data.tokenizer import TOKENIZERS
from test_train_gpt2 import args, cli_error, train_in_process, write_corpus

TEXTS = ["First document.\nÜnïcödé — ", "Second, with a lone surrogate \ud800 from a JSON escape."]


def eval_records(out_dir):
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"]


@pytest.fixture
def byte_shards(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": TEXTS[i % 2] * 3}) + "\n" for i in range(40)))
    out = tmp_path / "bytes"
    fineweb.main(["--tokenizer", "bytes", "--input", str(path), "--out", str(out), "--shard-size", "2e3",
                  "--workers", "1"])
    return out


def test_byte_shards_are_utf8_bytes_after_an_0xff_separator(byte_shards):
    manifest = json.loads((byte_shards / "manifest.json").read_text())
    assert (manifest["tokenizer"], manifest["vocab_size"], manifest["eot"]) == ("bytes", 256, 0xFF)
    stream = np.concatenate([np.load(byte_shards / s["file"]) for s in manifest["shards"]])
    texts = [(TEXTS[i % 2] * 3).replace("\ud800", "\ufffd") for i in range(40)]
    expected = b"".join(b"\xff" + t.encode("utf-8") for t in texts)
    assert stream.dtype == np.uint16 and bytes(stream.astype(np.uint8)) == expected
    assert shards_tokenizer(byte_shards) == (TOKENIZERS["bytes"], None)
    x, y = ShardLoader(byte_shards, "train", B=2, T=8, vocab_size=256).next_batch()
    assert int(x.max()) < 256


def test_bytes_decode_with_replacement():
    assert TOKENIZERS["bytes"].decode([72, 105, 0xFF, 0xC3]) == "Hi\ufffd\ufffd"


def test_byte_run_reports_bpb_as_loss_over_ln2_and_samples_text(byte_shards, tmp_path, capsys):
    out = tmp_path / "out"
    # vocab_size 320: more rows than the byte shards need (said in one line), and samples still decode as bytes
    train_in_process(args(byte_shards, out, vocab_size=320, max_steps=2, eval_interval=2, val_tokens=256))
    text = capsys.readouterr().out
    records = eval_records(out)
    assert len(records) == 2 and all(r["val_bpb"] == r["val_loss"] / math.log(2) for r in records)
    assert f"bpb {records[-1]['val_bpb']:.4f}" in text
    assert "val bits per byte: 256 target tokens of 256 bytes (bytes)" in text
    assert "note: the model's vocab_size 320 is more than the bytes shards" in text and "--vocab-size 256" in text
    assert "rank 0 sample: \"Hello, I'm a language model," in text


def test_a_model_too_small_for_the_shards_is_one_line(byte_shards, tmp_path):
    error = cli_error(args(byte_shards, tmp_path / "out", vocab_size=128))
    assert "holds bytes tokens (ids up to 255)" in error and "set --vocab-size 256" in error and "\n" not in error


@pytest.fixture
def hello_shards(tmp_path, gpt2_enc):
    """GPT-2 shards of `Hello world` documents: <|endoftext|> Hello ␣world, repeated (1, 5 and 6 bytes)."""
    assert gpt2_enc.encode_ordinary("Hello world") == [15496, 995]
    path = tmp_path / "hello.jsonl"
    path.write_text((json.dumps({"text": "Hello world"}) + "\n") * 40)
    out = tmp_path / "bpe"
    fineweb.main(["--input", str(path), "--out", str(out), "--shard-size", "30", "--val-tokens", "30",
                  "--workers", "1"])
    return out


# Windows of T=4 targets at stride 4 over the period (1, 5, 6): targets H W E H = 17 bytes, W E H W = 18,
# E H W E = 13, then again. Inputs x instead of targets y would count 13, 17, 18; <|endoftext|> as its 13
# characters would count 29, 18, 37.
HAND_BYTES = [17, 18, 13, 17]


def test_bpe_validation_bytes_by_hand_and_split_over_ranks(hello_shards):
    gpt2 = TOKENIZERS["gpt2"]
    assert validation_bytes(hello_shards, gpt2, batch=4, T=4, steps=1) == sum(HAND_BYTES)
    assert validation_bytes(hello_shards, gpt2, batch=2, T=4, steps=2) == sum(HAND_BYTES)
    # what 2 ranks of batch 1 score over 2 steps: the same 4 sequences as one batch of 2 x 2 steps
    lengths = gpt2.byte_lengths()
    ranks = [ShardLoader(hello_shards, "val", 1, 4, rank=r, world_size=2, shuffle=False) for r in range(2)]
    assert sum(int(lengths[loader.next_batch()[1].numpy()].sum()) for loader in ranks for _ in range(2)) == 65


def test_bpe_run_reports_bpb_from_the_target_bytes(hello_shards, tmp_path, capsys):
    out = tmp_path / "out"
    train_in_process(args(hello_shards, out, vocab_size=50304, n_layer=1, n_embd=16, block_size=4, seq_len=4,
                          batch_size=2, total_batch_size=8, val_tokens=16, max_steps=1, eval_interval=1))
    assert "val bits per byte: 16 target tokens of 65 bytes (gpt2)" in capsys.readouterr().out
    for r in eval_records(out):
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2) * 16 / sum(HAND_BYTES), rel=1e-12)


def test_shards_without_a_manifest_report_no_bpb(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", n_train_shards=1, tokens=1000)
    train_in_process(args(data, tmp_path / "out", max_steps=1, eval_interval=1))
    assert "no val bits per byte: " in capsys.readouterr().out
    assert not any("val_bpb" in r for r in eval_records(tmp_path / "out"))
    assert shards_tokenizer(data) == (None, f"{data} has no manifest.json to name the shards' tokenizer "
                                            "(shards from elsewhere)")


def test_a_foreign_shard_beside_ours_leaves_the_tokenizer_unknown(byte_shards):
    np.save(byte_shards / "edufineweb_train_000009.npy", np.zeros(100, dtype=np.uint16))
    tokenizer, why = shards_tokenizer(byte_shards)
    assert tokenizer is None and "edufineweb_train_000009.npy is not listed in" in why
