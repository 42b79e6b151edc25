"""Parallel text: local files in both layouts, one-line errors, the joint sentencepiece model and its cache,
length filtering, and the token-count batching loader (coverage, limits, determinism, exact resume, ranks)."""
import gzip
import random

import numpy as np
import pytest

from data.parallel_corpus import (DataError, TokenBatchLoader, encode, load_sentencepiece, load_split, sentencepiece_model)

LEXICON = {"der": "the", "hund": "dog", "katze": "cat", "sieht": "sees", "einen": "a", "ball": "ball",
           "und": "and", "mann": "man", "frau": "woman", "läuft": "runs", "schnell": "fast", "heute": "today",
           "wasser": "water", "trinkt": "drinks", "kleine": "small", "große": "big", "haus": "house"}


def write_corpus(root, n_train=300, n_eval=20, seed=0, gz_train_target=False):
    """Generated word-for-word De-En pairs as train/valid/test.{de,en} under root."""
    rng = random.Random(seed)
    words = sorted(LEXICON)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        de = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(n)]
        de = [s[0].upper() + s[1:] + "." for s in de]
        en = [" ".join(LEXICON[w.lower().rstrip(".")] for w in s.split()) + "." for s in de]
        (root / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        if split == "train" and gz_train_target:
            with gzip.open(root / f"{split}.en.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(en) + "\n")
        else:
            (root / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return root


def test_directory_and_prefix_layouts(tmp_path):
    root = write_corpus(tmp_path / "corpus", gz_train_target=True)
    src, tgt = load_split("train", "de", "en", data_dir=root)
    assert len(src) == len(tgt) == 300 and tgt[0].endswith(".") and "hund" not in tgt[0]
    vsrc, vtgt = load_split("valid", "de", "en", data_dir="unused", prefix=str(root / "valid"))
    assert (vsrc, vtgt) == load_split("valid", "de", "en", data_dir=root)
    with pytest.raises(DataError, match=r"test\.fr not found.*--test-prefix"):
        load_split("test", "de", "fr", data_dir=root)


def test_mismatched_and_empty_files_are_one_line_errors(tmp_path):
    root = write_corpus(tmp_path / "c")
    (root / "valid.en").write_text("one line only\n")
    with pytest.raises(DataError, match=r"valid\.de has 20 lines but .*valid\.en has 1; .*line-aligned") as e:
        load_split("valid", "de", "en", data_dir=root)
    assert "\n" not in str(e.value)
    (root / "test.de").write_text("\n\n")
    with pytest.raises(DataError, match=r"test\.de is empty"):
        load_split("test", "de", "en", data_dir=root)


def test_unreachable_hub_says_to_pass_local_files(monkeypatch):
    """One quick request decides: no minute of `datasets` retries before the one-line answer."""
    import data.parallel_corpus
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(data.parallel_corpus, "hub_unreachable", lambda: "Name or service not known")
    with pytest.raises(DataError, match=r"could not reach the Hugging Face hub .*Name or service not known.*"
                                        r"pass local files: --data-dir"):
        load_split("valid", "de", "en", hf_dataset="IWSLT/iwslt2017-not-cached-here")


def test_hub_dataset_falls_back_to_its_parquet_conversion(monkeypatch):
    """IWSLT2017 on the hub is a loading script, which datasets>=4 refuses: the loader retries the hub's
    parquet conversion and reads the `translation` column in IWSLT's schema."""
    import datasets

    import data.parallel_corpus
    rows = [{"translation": {"de": f"Satz {i}.", "en": f"Sentence {i}."}} for i in range(3)]
    calls = []

    def load_dataset(name, config, split, **kwargs):
        calls.append((name, config, split, kwargs))
        if "revision" not in kwargs:
            raise RuntimeError("Dataset scripts are no longer supported, but found iwslt2017.py")
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(data.parallel_corpus, "hub_unreachable", lambda: "")  # the hub answers, in this test
    src, tgt = load_split("valid", "de", "en")
    assert src == ["Satz 0.", "Satz 1.", "Satz 2."] and tgt == ["Sentence 0.", "Sentence 1.", "Sentence 2."]
    assert calls == [("IWSLT/iwslt2017", "iwslt2017-de-en", "validation", {}),
                     ("IWSLT/iwslt2017", "iwslt2017-de-en", "validation", {"revision": "refs/convert/parquet"})]


def test_sentencepiece_is_joint_cached_and_round_trips(tmp_path):
    src, tgt = load_split("train", "de", "en", data_dir=write_corpus(tmp_path / "c"))
    model = sentencepiece_model(src, tgt, 60, "bpe", tmp_path / "cache")
    cached = list((tmp_path / "cache").glob("spm_bpe60_*.model"))
    assert len(cached) == 1 and cached[0].read_bytes() == model
    assert sentencepiece_model(src, tgt, 60, "bpe", tmp_path / "cache") == model  # from the cache
    sp = load_sentencepiece(model)
    assert sp.get_piece_size() == 60 and [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()] == [0, 1, 2, 3]
    for line in src[:20] + tgt[:20]:  # joint: both languages decode losslessly
        assert sp.decode(sp.encode(line)) == line
    sentencepiece_model(src[:-1], tgt[:-1], 60, "bpe", tmp_path / "cache")  # other text, other key
    assert len(list((tmp_path / "cache").glob("*.model"))) == 2
    with pytest.raises(DataError, match="lower --spm-vocab-size"):
        sentencepiece_model(src[:5], tgt[:5], 5000, "bpe", tmp_path / "cache")


def test_length_filter(tmp_path):
    src, tgt = load_split("train", "de", "en", data_dir=write_corpus(tmp_path / "c"))
    sp = load_sentencepiece(sentencepiece_model(src, tgt, 60, "bpe", tmp_path))
    all_src, all_tgt = encode(sp, src, tgt)
    short_src, short_tgt = encode(sp, src, tgt, max_len=8)
    expected = sum(len(s) <= 8 and len(t) <= 8 for s, t in zip(all_src, all_tgt))
    assert 0 < len(short_src) == expected < len(all_src)
    assert max(max(len(s), len(t)) for s, t in zip(short_src, short_tgt)) <= 8


def lengths_corpus(n=500, seed=0):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, rng.integers(1, 40)) for _ in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(1, 40)) for _ in range(n)]
    return src, tgt


def epoch_ids(loader):
    out = []
    for _ in range(len(loader)):
        x, y_in, y_out = loader.next_batch()
        assert x.shape[0] * max(x.shape[1], y_out.shape[1]) <= loader.max_tokens
        assert (y_in[:, 0] == 2).all() and ((x == 3).sum(1) == 1).all() and ((y_out == 3).sum(1) == 1).all()
        out.append((x.tolist(), y_out.tolist()))
    return out


def test_loader_covers_epoch_respects_limits_and_reshuffles():
    src, tgt = lengths_corpus()
    loader = TokenBatchLoader(src, tgt, max_tokens=400, max_sentences=16, seed=3)
    first = epoch_ids(loader)
    rows = [tuple(t for t in row if t > 3) for batch in first for row in batch[0]]
    assert sorted(rows) == sorted(tuple(s.tolist()) for s in src)  # every pair once
    assert max(len(b[0]) for b in first) <= 16
    second = epoch_ids(loader)
    assert loader.epoch == 1 and len(second) == len(first) and second != first
    again = TokenBatchLoader(src, tgt, max_tokens=400, max_sentences=16, seed=3)
    assert epoch_ids(again) == first  # a pure function of the seed


def test_loader_resumes_exactly():
    src, tgt = lengths_corpus()
    loader = TokenBatchLoader(src, tgt, max_tokens=300, seed=7)
    for _ in range(len(loader) + 5):  # into the second epoch
        loader.next_batch()
    state = loader.state_dict()
    expected = [loader.next_batch()[0].tolist() for _ in range(len(loader))]
    resumed = TokenBatchLoader(src, tgt, max_tokens=300, seed=7)
    resumed.load_state_dict(state)
    assert [resumed.next_batch()[0].tolist() for _ in range(len(loader))] == expected
    with pytest.raises(DataError, match="max_tokens=300, this run has 200"):
        TokenBatchLoader(src, tgt, max_tokens=200, seed=7).load_state_dict(state)


def test_ranks_get_disjoint_equal_shares():
    src, tgt = lengths_corpus()
    ranks = [TokenBatchLoader(src, tgt, max_tokens=300, rank=r, world_size=3, seed=1) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    seen = [tuple(row) for r in ranks for batch in epoch_ids(r) for row in batch[0]]
    assert len(seen) == len(set(seen)) > 0.9 * len(src)  # only the last < world_size batches are dropped



def test_an_optimizer_step_trains_the_same_batches_on_any_number_of_ranks():
    """8 batches a step: 1 rank accumulating 8, 2 ranks accumulating 4, 4 ranks accumulating 2. Step k takes the
    same batches in every layout, for two epochs, and resumes only in its own layout."""
    src, tgt = lengths_corpus()

    def steps(world_size):
        ranks = [TokenBatchLoader(src, tgt, max_tokens=300, rank=r, world_size=world_size, seed=4,
                                  accum=8 // world_size) for r in range(world_size)]
        assert len({r.steps_per_epoch() for r in ranks}) == 1
        return [sorted(tuple(row) for r in ranks for _ in range(r.accum) for row in r.next_batch()[0].tolist())
                for _ in range(2 * ranks[0].steps_per_epoch())], ranks[0]

    one, loader = steps(1)
    assert steps(2)[0] == one == steps(4)[0] and loader.epoch == 1 and len(one) == 2 * loader.steps_per_epoch()
    assert loader.steps_per_epoch() == len(loader) // 8 and len(loader) % 8 == 0
    with pytest.raises(DataError, match="accum=8, this run has 4"):
        TokenBatchLoader(src, tgt, max_tokens=300, seed=4, accum=4).load_state_dict(loader.state_dict())
    with pytest.raises(DataError, match=r"fewer batches than one optimizer step takes \(2 processes x 10000"):
        TokenBatchLoader(src, tgt, max_tokens=300, world_size=2, accum=10000)

def test_padded_batches_have_few_shapes_and_cover_the_epoch():
    src, tgt = lengths_corpus(800)
    loader = TokenBatchLoader(src, tgt, max_tokens=600, max_sentences=40, seed=2, pad_multiple=8)
    assert loader.shapes() == 5  # sides of 1-39 tokens + EOS -> L in 8, 16, ..., 40
    exact = TokenBatchLoader(src, tgt, max_tokens=600, max_sentences=40, seed=2)
    shapes, rows, exact_shapes = set(), [], {tuple(exact.next_batch()[0].shape) for _ in range(len(exact))}
    for _ in range(2 * len(loader)):  # two epochs
        x, y_in, y_out = loader.next_batch()
        B, L = x.shape
        shapes.add((B, L, y_out.shape[1]))
        assert L % 8 == 0 and y_in.shape == y_out.shape == (B, L) and B * L <= 600 and B <= 40
        real = (y_out != 0).any(1)
        assert ((x[~real] != 0).sum(1) == 1).all() and (x[~real, 0] == 3).all() and (y_in[~real, 0] == 2).all()
        assert ((x[real] == 3).sum(1) == 1).all() and (y_in[real, 0] == 2).all()  # real rows as before
        rows += [tuple(t for t in row if t > 3) for row in x[real].tolist()] if loader.epoch == 0 else []
    assert len(shapes) <= loader.shapes() < len(exact_shapes)
    assert {16, 24, 32, 40} <= {L for _, L, _ in shapes} <= {8, 16, 24, 32, 40} and all(B == min(40, 600 // L) for B, L, _ in shapes)
    assert sorted(rows) == sorted(tuple(s.tolist()) for s in src)  # every pair once in the first epoch


def test_padded_loader_resumes_and_refuses_other_padding():
    src, tgt = lengths_corpus()
    loader = TokenBatchLoader(src, tgt, max_tokens=300, seed=7, pad_multiple=16)
    for _ in range(len(loader) + 3):
        loader.next_batch()
    state = loader.state_dict()
    expected = [loader.next_batch()[0].tolist() for _ in range(5)]
    resumed = TokenBatchLoader(src, tgt, max_tokens=300, seed=7, pad_multiple=16)
    resumed.load_state_dict(state)
    assert [resumed.next_batch()[0].tolist() for _ in range(5)] == expected
    with pytest.raises(DataError, match="pad_multiple=16, this run has 1"):
        TokenBatchLoader(src, tgt, max_tokens=300, seed=7).load_state_dict(state)
    old = {k: v for k, v in TokenBatchLoader(src, tgt, max_tokens=300, seed=7).state_dict().items()
           if k != "pad_multiple"}  # a checkpoint from before padding existed
    TokenBatchLoader(src, tgt, max_tokens=300, seed=7).load_state_dict(old)
