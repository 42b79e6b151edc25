"""data/fineweb.py (local files -> shards, resume) and data/loader.py (order, ranks, exact resume, validation)."""
import gzip
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from data.loader import ShardLoader

CACHE = Path(__file__).resolve().parents[1].parent / "shared/assets/tokenizer/tiktoken_cache"


@pytest.fixture(scope="module")
def fineweb():
    """data.fineweb with a working offline gpt2 encoding, or a skip."""
    tiktoken = pytest.importorskip("tiktoken")
    if "TIKTOKEN_CACHE_DIR" not in os.environ and CACHE.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(CACHE)  # os.environ, so the tokenizer workers see it too
    try:
        tiktoken.get_encoding("gpt2")
    except Exception as e:
        pytest.skip(f"tiktoken gpt2 encoding unavailable offline: {e}")
    import data.fineweb
    return data.fineweb


@pytest.fixture(scope="module")
def enc(fineweb):
    return fineweb.gpt2_tokenizer()


DOCS_TXT = ["First document.\nIt has two lines.", "Ünïcödé — and a literal <|endoftext|> inside the text.",
            "Third " * 50]
DOCS_JSONL = [f"Row {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(30)]
DOCS_PARQUET = ["Parquet row one.", "Parquet row two, a bit longer than the first."]


def write_inputs(tmp_path):
    """Local inputs of every kind; returns (paths, their documents in order)."""
    paths, docs = [], []
    for i, text in enumerate(DOCS_TXT):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
        docs.append(text)
    paths.append(tmp_path / "rows.jsonl.gz")
    with gzip.open(paths[-1], "wt", encoding="utf-8") as f:
        for i, text in enumerate(DOCS_JSONL):
            f.write(json.dumps({"id": i, "text": text}) + "\n" + ("\n" if i == 3 else ""))  # blank lines are skipped
    docs += DOCS_JSONL
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return paths, docs
    paths.append(tmp_path / "rows.parquet")
    pq.write_table(pa.table({"text": DOCS_PARQUET, "n": [1, 2]}), paths[-1])
    return paths, docs + DOCS_PARQUET


def expected_stream(enc, docs):
    return np.concatenate([[50256] + enc.encode_ordinary(d) for d in docs]).astype(np.uint16)


def read_shards(out):
    m = json.loads((out / "manifest.json").read_text())
    arrays = [np.load(out / s["file"]) for s in m["shards"]]
    return m, arrays


def prep(fineweb, paths, out, *extra):
    return fineweb.main(["--input", *map(str, paths), "--out", str(out), "--workers", "1", *extra])


def test_local_files_become_shards(fineweb, enc, tmp_path):
    paths, docs = write_inputs(tmp_path)
    out = tmp_path / "shards"
    fineweb.main(["--input", *map(str, paths), "--out", str(out), "--shard-size", "1e2", "--workers", "2"])
    stream = expected_stream(enc, docs)
    assert len(stream) == sum(len(enc.encode_ordinary(d)) + 1 for d in docs) > 400

    m, arrays = read_shards(out)
    assert m["finished"] and m["documents"] == len(docs) and m["total_tokens"] == len(stream)
    assert m["eot"] == 50256 and m["tokenizer"] == "gpt2" and m["shard_size"] == 100
    assert [s["file"] for s in m["shards"]] == [f"local_{'val' if i == 0 else 'train'}_{i:06d}.npy"
                                               for i in range(len(arrays))]
    assert [s["split"] for s in m["shards"]] == ["val"] + ["train"] * (len(arrays) - 1)
    assert sorted(p.name for p in out.iterdir()) == sorted([s["file"] for s in m["shards"]] + ["manifest.json"])
    assert all(a.dtype == np.uint16 for a in arrays)
    assert [len(a) for a in arrays] == [s["tokens"] for s in m["shards"]]
    assert [len(a) for a in arrays[:-1]] == [100] * (len(arrays) - 1) and 0 < len(arrays[-1]) <= 100
    np.testing.assert_array_equal(np.concatenate(arrays), stream)

    x, y = ShardLoader(out, "train", B=4, T=16).next_batch()
    assert x.shape == (4, 16) and int(x.max()) < 50257 and torch.equal(x[:, 1:], y[:, :-1])


def test_rerun_of_finished_output_rewrites_nothing(fineweb, tmp_path, capsys):
    paths, _ = write_inputs(tmp_path)
    out = tmp_path / "shards"
    prep(fineweb, paths, out, "--shard-size", "100")
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prep(fineweb, paths, out, "--shard-size", "100")
    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_interrupted_run_resumes_to_the_same_shards(fineweb, tmp_path, monkeypatch):
    paths, _ = write_inputs(tmp_path)
    prep(fineweb, paths, tmp_path / "whole", "--shard-size", "64")
    _, whole = read_shards(tmp_path / "whole")

    out = tmp_path / "resumed"
    real_write, calls = fineweb.ShardWriter._write, []

    def crash_on_fourth(self, n):
        calls.append(n)
        if len(calls) == 4:
            raise KeyboardInterrupt
        real_write(self, n)

    monkeypatch.setattr(fineweb.ShardWriter, "_write", crash_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        prep(fineweb, paths, out, "--shard-size", "64")
    monkeypatch.undo()
    m, partial = read_shards(out)
    assert not m["finished"] and len(partial) == 3 and m["resume"]["doc"] > 0  # earlier documents are skipped
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.npy")}

    prep(fineweb, paths, out, "--shard-size", "64")
    m, resumed = read_shards(out)
    assert m["finished"] and len(resumed) == len(whole)
    for a, b in zip(resumed, whole):
        np.testing.assert_array_equal(a, b)
    assert all(out.joinpath(name).stat().st_mtime_ns == t for name, t in stamps.items())
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]


def test_val_split_of_a_small_corpus(fineweb, enc, tmp_path):
    paths, docs = write_inputs(tmp_path)
    total = len(expected_stream(enc, docs))
    prep(fineweb, paths, tmp_path / "auto", "--shard-size", "1e6")  # corpus < 2 shards: val gets 10%
    m, arrays = read_shards(tmp_path / "auto")
    assert [len(a) for a in arrays] == [total // 10, total - total // 10]
    prep(fineweb, paths, tmp_path / "fixed", "--shard-size", "1e6", "--val-tokens", "50")
    m, arrays = read_shards(tmp_path / "fixed")
    assert [len(a) for a in arrays] == [50, total - 50] and m["val_tokens"] == 50


def test_max_tokens_and_max_docs(fineweb, enc, tmp_path):
    paths, docs = write_inputs(tmp_path)
    prep(fineweb, paths, tmp_path / "t", "--shard-size", "100", "--max-tokens", "250")
    _, arrays = read_shards(tmp_path / "t")
    np.testing.assert_array_equal(np.concatenate(arrays), expected_stream(enc, docs)[:250])
    prep(fineweb, paths, tmp_path / "d", "--shard-size", "100", "--max-docs", "5")
    m, arrays = read_shards(tmp_path / "d")
    assert m["documents"] == 5
    np.testing.assert_array_equal(np.concatenate(arrays), expected_stream(enc, docs[:5]))


@pytest.mark.parametrize("streaming", [False, True])
def test_huggingface_source(fineweb, enc, tmp_path, monkeypatch, streaming):
    datasets = pytest.importorskip("datasets")
    docs = DOCS_JSONL

    def load_dataset(path, name, split, streaming):
        assert (path, name, split) == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train")
        ds = datasets.Dataset.from_dict({"text": docs, "url": ["u"] * len(docs)})
        return ds.to_iterable_dataset() if streaming else ds

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(fineweb, "hub_unreachable", lambda: "")  # no network in tests
    args = ["--out", str(tmp_path), "--shard-size", "100", "--max-docs", "20", "--workers", "1"]
    fineweb.main(args + (["--streaming"] if streaming else []))
    m, arrays = read_shards(tmp_path)
    assert m["source"] == "HuggingFaceFW/fineweb-edu/sample-10BT" and m["documents"] == 20
    assert m["shards"][0]["file"] == "fineweb_edu_val_000000.npy"
    np.testing.assert_array_equal(np.concatenate(arrays), expected_stream(enc, docs[:20]))


def test_offline_hub_is_one_line_and_leaves_no_directory(fineweb, tmp_path, monkeypatch):
    import urllib.error
    import urllib.request
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "fw"

    def no_network(request, timeout):
        assert timeout <= 10  # fail fast, not after datasets' ~30 s of retries
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    def load_dataset(*args, **kwargs):
        raise AssertionError("the hub was probed unreachable: datasets must not be asked")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(SystemExit, match=r"Name or service not known.*--input FILES.*HF_HUB_OFFLINE=1") as e:
        fineweb.main(["--streaming", "--out", str(out), "--workers", "1"])
    assert "\n" not in str(e.value) and not out.exists()

    def not_cached(*args, **kwargs):  # what datasets raises offline without a cached copy
        raise ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub (OfflineModeIsEnabled)\nmore")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set: no probe, datasets looks in its cache
    monkeypatch.setattr(datasets, "load_dataset", not_cached)
    with pytest.raises(SystemExit, match=r"OfflineModeIsEnabled\)\); offline, .*--input FILES") as e:
        fineweb.main(["--out", str(out), "--workers", "1"])
    assert "\n" not in str(e.value) and "HF_HUB_OFFLINE=1" not in str(e.value) and not out.exists()


def test_bad_inputs_give_one_line_errors(fineweb, tmp_path):
    no_text = tmp_path / "bad.jsonl"
    no_text.write_text('{"text": "fine"}\n{"body": "no text here"}\n')
    unknown = tmp_path / "notes.md"
    unknown.write_text("hi")
    cases = [(tmp_path / "missing.txt", "no such input file"), (no_text, "bad.jsonl:2: row has no 'text'"),
             (unknown, "notes.md: unknown file type")]
    for path, message in cases:
        with pytest.raises(SystemExit, match=message) as e:
            prep(fineweb, [path], tmp_path / "out")
        assert "\n" not in str(e.value) and not (tmp_path / "out").exists()  # no empty directory left

    good = tmp_path / "good.txt"
    good.write_text("a small document " * 40)
    prep(fineweb, [good], tmp_path / "out2", "--shard-size", "100")
    with pytest.raises(SystemExit, match="different shard_size"):
        prep(fineweb, [good], tmp_path / "out2", "--shard-size", "200")


# ---- loader, on synthetic shards: token value = 5000 * shard + position, so x[:, 0] names its window

def write_shards(d, sizes, split="train"):
    d.mkdir(parents=True, exist_ok=True)
    for k, n in enumerate(sizes):
        np.save(d / f"syn_{split}_{k:06d}.npy", (5000 * k + np.arange(n)).astype(np.uint16))
    return d


def firsts(loader, steps):
    return [loader.next_batch()[0][:, 0].tolist() for _ in range(steps)]


def test_batches_are_shifted_windows(tmp_path):
    d = write_shards(tmp_path, [200, 150])
    x, y = ShardLoader(d, "train", B=4, T=8, seed=1).next_batch()
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(x, x[:, :1] + torch.arange(8)) and torch.equal(y[:, -1], x[:, 0] + 8)  # contiguous
    assert all(v % 5000 % 8 == 0 for v in x[:, 0].tolist())  # windows start at multiples of T


def test_shuffle_is_seeded(tmp_path):
    d = write_shards(tmp_path, [400, 300, 200])
    runs = [firsts(ShardLoader(d, "train", B=4, T=8, seed=s), 30) for s in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert firsts(ShardLoader(d, "train", B=4, T=8, shuffle=False), 2) == [[0, 8, 16, 24], [32, 40, 48, 56]]


def test_ranks_split_each_step_and_cover_the_epoch(tmp_path):
    d = write_shards(tmp_path, [41, 33, 25])  # 5 + 4 + 3 = 12 windows of T=8: 2 steps of 2 ranks x B=3
    whole = firsts(ShardLoader(d, "train", B=6, T=8, seed=3), 6)
    ranks = [firsts(ShardLoader(d, "train", B=3, T=8, rank=r, world_size=2, seed=3), 6) for r in (0, 1)]
    assert [a + b for a, b in zip(*ranks)] == whole  # step n: rank r gets rows r*B .. r*B+B-1 of the stream
    epoch = [v for step in ranks[0][:2] + ranks[1][:2] for v in step]
    windows = [5000 * k + 8 * i for k, n in enumerate((5, 4, 3)) for i in range(n)]
    assert sorted(epoch) == windows
    assert sorted(whole[2] + whole[3]) == windows and whole[2] + whole[3] != whole[0] + whole[1]  # epoch 1 reshuffled


def test_tiny_corpus_still_fills_batches(tmp_path):
    d = write_shards(tmp_path, [17])  # 2 windows of T=8
    loader = ShardLoader(d, "train", B=5, T=8, rank=1, world_size=3)
    x, _ = loader.next_batch()
    assert x.shape == (5, 8) and sorted(set(x[:, 0].tolist())) == [0, 8]
    assert loader.state_dict()["epoch"] == 7  # 15 sequences consumed by the step = 7.5 epochs


def test_state_dict_resumes_exactly(tmp_path):
    d = write_shards(tmp_path, [60, 90, 35])  # 7 + 11 + 4 windows: steps cross shard and epoch boundaries
    for rank in (0, 1):
        loader = ShardLoader(d, "train", B=3, T=8, rank=rank, world_size=2, seed=5)
        states, batches = [], []
        for _ in range(20):
            states.append(json.loads(json.dumps(loader.state_dict())))  # plain JSON types
            batches.append(loader.next_batch())
        assert states[-1]["epoch"] >= 4
        for k in (0, 3, 7, 11, 19):
            fresh = ShardLoader(d, "train", B=3, T=8, rank=rank, world_size=2, seed=5)
            fresh.load_state_dict(states[k])
            for x, y in batches[k:]:
                x2, y2 = fresh.next_batch()
                assert torch.equal(x, x2) and torch.equal(y, y2)
    other = ShardLoader(d, "train", B=3, T=8, seed=6)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(states[3])


def test_val_reset_repeats(tmp_path):
    d = write_shards(tmp_path, [100], split="val")
    loader = ShardLoader(d, "val", B=2, T=8, shuffle=False)
    first = [loader.next_batch() for _ in range(9)]  # 12 windows: wraps around
    loader.reset()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, [loader.next_batch() for _ in range(9)]))
    assert first[0][0][:, 0].tolist() == [0, 8]


def npy_bytes(tokens):
    import io
    buf = io.BytesIO()
    np.save(buf, tokens)
    return buf.getvalue()


@pytest.mark.parametrize("content, message", [
    (npy_bytes(np.arange(100, dtype=np.int32)), "a 1-D int32 array; expected a 1-D uint16 array"),
    (npy_bytes(np.zeros((10, 10), dtype=np.uint16)), "a 2-D uint16 array; expected a 1-D uint16 array"),
    (npy_bytes(np.zeros(0, dtype=np.uint16)), "empty shard"),
    (npy_bytes(np.arange(5, dtype=np.uint16)), "fewer than seq_len"),
    (npy_bytes(np.full(100, 50257, dtype=np.uint16)), "token id 50257 >= the model's vocab_size 50257"),
    (np.random.default_rng(0).bytes(1000), r"not a .npy array \(missing or damaged NUMPY header\)"),
    (b"", "not a .npy array"),
    (npy_bytes(np.arange(100, dtype=np.uint16))[:60], "not a .npy array"),  # cut inside the header
    (npy_bytes(np.arange(100, dtype=np.uint16))[:-7], r"truncated: its header promises 100 tokens \(200 bytes\) but "
                                                      "193 bytes follow"),
], ids=["int32", "2-D", "empty", "short", "beyond-vocab", "random-bytes", "zero-bytes", "cut-in-header", "truncated"])
def test_bad_shard_is_named_in_one_line(tmp_path, content, message):
    write_shards(tmp_path, [100])
    (tmp_path / "syn_train_000001.npy").write_bytes(content)
    with pytest.raises(ValueError, match=message) as e:
        ShardLoader(tmp_path, "train", B=2, T=8)
    text = str(e.value)
    assert str(tmp_path / "syn_train_000001.npy") in text and "data/fineweb.py" in text
    assert "\n" not in text and "pickle" not in text  # our words, not np.load's


def test_shards_must_match_their_manifest(fineweb, tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("a small document " * 100)
    out = tmp_path / "shards"
    prep(fineweb, [good], out, "--shard-size", "100", "--max-tokens", "300")
    ShardLoader(out, "train", B=2, T=8)
    shard = out / "local_train_000001.npy"
    tokens = np.load(shard)
    np.save(shard, tokens[:50])  # a valid .npy, but not the shard data/fineweb.py wrote
    with pytest.raises(ValueError, match="local_train_000001.npy: 50 tokens but manifest.json records 100; "
                                         "prepare the shards again"):
        ShardLoader(out, "train", B=2, T=8)
    with pytest.raises(SystemExit, match="local_train_000001.npy is missing or not the size"):
        prep(fineweb, [good], out, "--shard-size", "100", "--max-tokens", "300")  # rerunning data/fineweb.py finds it too
    shard.write_bytes(np.random.default_rng(0).bytes(300))
    with pytest.raises(SystemExit, match="local_train_000001.npy: not a .npy array") as e:
        prep(fineweb, [good], out, "--shard-size", "100", "--max-tokens", "300")
    assert "pickle" not in str(e.value)
    shard.unlink()
    with pytest.raises(ValueError, match="local_train_000001.npy is missing .*manifest.json lists it"):
        ShardLoader(out, "train", B=2, T=8)


def test_missing_or_unfinished_data_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="data directory .*/nowhere/ does not exist; .*python data/fineweb.py"):
        ShardLoader(tmp_path / "nowhere", "train", B=2, T=8)
    with pytest.raises(FileNotFoundError, match="no '\\*_train_\\*.npy' or .* token shards in .*python data/fineweb.py") as e:
        ShardLoader(tmp_path, "train", B=2, T=8)
    assert str(tmp_path) in str(e.value)
    (tmp_path / "syn_train_000000.npy").write_bytes(b"not numpy")
    with pytest.raises(ValueError, match="not a .npy array"):
        ShardLoader(tmp_path, "train", B=2, T=8)
    write_shards(tmp_path, [100])
    (tmp_path / "syn_train_000001.npy.tmp").write_bytes(b"half-written")  # ignored: not *.npy
    ShardLoader(tmp_path, "train", B=2, T=8)
    (tmp_path / "manifest.json").write_text(json.dumps({"finished": False}))
    with pytest.raises(ValueError, match="unfinished"):
        ShardLoader(tmp_path, "train", B=2, T=8)


@pytest.mark.parametrize("durable", [False, True])
def test_atomic_file_replaces_whole_or_not_at_all(tmp_path, durable):
    from data.files import atomic_file, remove_temporaries
    path = tmp_path / "f.json"
    path.write_text("old")
    with pytest.raises(ZeroDivisionError):
        with atomic_file(path, "w", durable=durable) as f:
            f.write("half")
            1 / 0
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    with atomic_file(path, "w", durable=durable) as f:
        f.write("new")
        assert path.read_text() == "old"  # nothing under the final name until the block ends
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    (tmp_path / ".f.json.tmp4242").write_text("a killed writer's")
    (tmp_path / ".hidden.tmpfile").write_text("not ours")
    remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden.tmpfile", "f.json"]


# ---- start-up reads no shard whole once its statistics are known (data/shard_stats.py)

@pytest.fixture
def max_calls(monkeypatch):
    """Every whole-shard read of start-up (np.memmap.max: shards are memory-mapped), counted."""
    calls = []
    real = np.memmap.max
    monkeypatch.setattr(np.memmap, "max", lambda self, *a, **k: calls.append(self.filename) or real(self, *a, **k))
    return calls


def test_a_manifest_start_reads_no_shard_whole(fineweb, tmp_path, max_calls, monkeypatch):
    good = tmp_path / "good.txt"
    good.write_text("a small document " * 25000)
    out = tmp_path / "shards"
    prep(fineweb, [good], out, "--shard-size", "20000", "--max-tokens", "60000")  # 40 kB shards: sampled blocks
    m, arrays = read_shards(out)
    assert [(s["tokens"], s["max_token"]) for s in m["shards"]] == [(len(a), int(a.max())) for a in arrays]
    assert all(s["fingerprint"].startswith(f"{(out / s['file']).stat().st_size}:") for s in m["shards"])
    import data.loader
    opened, real_read = [], data.loader.read_tokens
    monkeypatch.setattr(data.loader, "read_tokens", lambda path: opened.append(path.name) or real_read(path))
    loader = ShardLoader(out, "train", B=2, T=8, shuffle=False)
    assert opened == [] and loader.state_dict()["shards"] == [["local_train_000001.npy", 20000],
                                                              ["local_train_000002.npy", 20000]]
    assert loader.next_batch()[0].shape == (2, 8) and opened == ["local_train_000001.npy"]  # opened when first used
    assert max_calls == [] and not (out / ".nanoact_shard_stats.json").exists()  # the manifest knew it all

    shard = out / "local_train_000001.npy"
    tokens = np.load(shard)
    tokens[0] = tokens[1]  # same size, other content: the fingerprint differs, so the shard is read when opened
    np.save(shard, tokens)
    ShardLoader(out, "train", B=2, T=8, shuffle=False).next_batch()
    assert [Path(f).name for f in max_calls] == ["local_train_000001.npy"]
    ShardLoader(out, "train", B=2, T=8, shuffle=False).next_batch()  # ... once: its new record is kept beside it
    assert len(max_calls) == 1
    tokens[0] = 50257
    np.save(shard, tokens)
    loader = ShardLoader(out, "train", B=2, T=8, shuffle=False)
    with pytest.raises(ValueError, match="local_train_000001.npy: token id 50257 >= the model's vocab_size 50257"):
        loader.next_batch()  # before any of its tokens are used
    np.save(shard, tokens[:-1])  # another size: the record does not count, start-up reads it
    with pytest.raises(ValueError, match="local_train_000001.npy: 19,999 tokens but manifest.json records 20,000"):
        ShardLoader(out, "train", B=2, T=8)


def test_foreign_shards_are_read_once_and_a_bad_one_still_fails(tmp_path, max_calls):
    from tests.test_shard_formats import write_build_nanogpt, write_llmc
    write_build_nanogpt(tmp_path, "train", 1, np.arange(100, 200))
    write_llmc(tmp_path / "edu_fineweb_train_000002.bin", np.arange(200, 300))
    (tmp_path / "train.bin").write_bytes(np.arange(300, 400, dtype=np.uint16).tobytes())
    first = ShardLoader(tmp_path, "train", B=2, T=8, shuffle=False)
    assert len(max_calls) == 3
    again = ShardLoader(tmp_path, "train", B=2, T=8, shuffle=False)
    assert again.state_dict() == first.state_dict()
    assert [again.next_batch()[0].tolist() for _ in range(18)] == [first.next_batch()[0].tolist() for _ in range(18)]
    assert len(max_calls) == 3  # 18 batches of 2 go through all 36 windows: every shard opened, none read again
    write_llmc(tmp_path / "edu_fineweb_train_000002.bin", [*range(200, 299), 60000])  # same size, a bad id
    loader = ShardLoader(tmp_path, "train", B=2, T=8, shuffle=False)  # edu_fineweb_train_000002.bin comes first
    with pytest.raises(ValueError, match=r"edu_fineweb_train_000002.bin: token id 60000 >= the model's vocab_size"):
        loader.next_batch()
    write_llmc(tmp_path / "edu_fineweb_train_000002.bin", [*range(200, 300), 60000])  # another size: at start-up
    with pytest.raises(ValueError, match=r"edu_fineweb_train_000002.bin: token id 60000 >= the model's vocab_size"):
        ShardLoader(tmp_path, "train", B=2, T=8, shuffle=False)


def test_a_read_only_shard_directory_keeps_its_statistics_in_the_cache(tmp_path, monkeypatch, max_calls):
    from data import shard_stats
    data, cache = write_shards(tmp_path / "data", [100, 120]), tmp_path / "cache"
    monkeypatch.setenv("NANOACT_CACHE", str(cache))
    real = shard_stats.atomic_file

    def read_only(path, *args, **kwargs):
        if Path(path).parent == data:
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shard_stats, "atomic_file", read_only)
    ShardLoader(data, "train", B=2, T=8)
    assert len(max_calls) == 2 and [p.name for p in data.iterdir()] != [] and not (data / shard_stats.SIDECAR).exists()
    assert len(list((cache / "shards").glob("*.json"))) == 1
    ShardLoader(data, "train", B=2, T=8)
    assert len(max_calls) == 2


def _start_loader(barrier, data, split):
    barrier.wait()
    ShardLoader(data, split, B=2, T=8)


def test_ranks_starting_together_read_each_shard_whole_once(tmp_path, monkeypatch):
    """Four processes (ranks) start at once on shards without records: one reads each shard whole and records it,
    the others wait for the lock beside the records and find them (each read is slowed, so that without the lock
    every process would read every shard). The records hold every shard of both splits: no update is lost."""
    data = write_shards(tmp_path / "data", [100, 120])
    write_shards(data, [90], split="val")
    reads, real = tmp_path / "reads", np.memmap.max

    def counted(self, *args, **kwargs):
        with open(reads, "a") as f:
            f.write(Path(self.filename).name + "\n")
        time.sleep(0.3)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(np.memmap, "max", counted)
    context = multiprocessing.get_context("fork")  # the children inherit the counting max
    barrier = context.Barrier(4)
    ranks = [context.Process(target=_start_loader, args=(barrier, data, split))
             for split in ("train", "train", "val", "train")]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=60)
    assert [rank.exitcode for rank in ranks] == [0, 0, 0, 0]
    names = ["syn_train_000000.npy", "syn_train_000001.npy", "syn_val_000000.npy"]
    assert sorted(reads.read_text().split()) == names
    from data import shard_stats
    assert sorted(json.loads((data / shard_stats.SIDECAR).read_text())["shards"]) == names
