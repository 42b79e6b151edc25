"""Token shards of build-nanogpt (.npy), llm.c (.bin with a 256 x int32 header) and nanoGPT (headerless
train.bin / val.bin), written here byte for byte as those projects write them, read by data/loader.py."""
import numpy as np
import pytest

from data.loader import ShardLoader


def write_llmc(path, tokens, magic=20240520, version=1, count=None, dtype=np.uint16):
    """llm.c's dev/data/data_common.py write_datafile: 256 int32 header (magic, version, count), then tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(tokens, dtype=dtype).tobytes())
    return path


def write_build_nanogpt(directory, split, index, tokens):
    """build-nanogpt's fineweb.py: np.save(f"edufineweb_{split}_{index:06d}", uint16 array) (np.save adds .npy)."""
    np.save(directory / f"edufineweb_{split}_{index:06d}", np.asarray(tokens, dtype=np.uint16))


def all_windows(loader, n_batches):
    return {tuple(row) for _ in range(n_batches) for row in loader.next_batch()[0].tolist()}


def test_llmc_build_nanogpt_and_our_shards_mix_in_one_directory(tmp_path):
    T = 8
    write_build_nanogpt(tmp_path, "val", 0, np.arange(0, 33))
    write_build_nanogpt(tmp_path, "train", 1, np.arange(100, 133))
    write_llmc(tmp_path / "edu_fineweb_train_000002.bin", np.arange(200, 233))
    np.save(tmp_path / "ours_train_000003.npy", np.arange(300, 333, dtype=np.uint16))
    loader = ShardLoader(tmp_path, "train", B=4, T=T, shuffle=False)
    assert loader.names == ["edu_fineweb_train_000002.bin", "edufineweb_train_000001.npy", "ours_train_000003.npy"]
    windows = all_windows(loader, 3)  # 3 shards x 4 windows of 8 (+1) tokens
    expected = {tuple(range(start + 8 * w, start + 8 * w + 8)) for start in (100, 200, 300) for w in range(4)}
    assert windows == expected
    x, y = ShardLoader(tmp_path, "val", B=4, T=T, shuffle=False).next_batch()
    assert x[0].tolist() == list(range(8)) and y[0].tolist() == list(range(1, 9))


def test_llmc_small_dataset_names_and_nanogpt_bins(tmp_path):
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", np.arange(40))
    (tmp_path / "nanogpt").mkdir()
    np.arange(50, 90, dtype=np.uint16).tofile(tmp_path / "nanogpt" / "train.bin")  # nanoGPT's prepare.py
    x, _ = ShardLoader(tmp_path, "val", B=1, T=8, shuffle=False).next_batch()
    assert x[0].tolist() == list(range(8))
    x, _ = ShardLoader(tmp_path / "nanogpt", "train", B=1, T=8, shuffle=False).next_batch()
    assert x[0].tolist() == list(range(50, 58))


@pytest.mark.parametrize("write, message", [
    (lambda p: write_llmc(p, np.arange(40), magic=12345), "bad magic 12345 in the header, expected 20240520"),
    (lambda p: write_llmc(p, np.arange(40), magic=20240801, version=7, dtype=np.uint32), "LLaMA-3 shard"),
    (lambda p: write_llmc(p, np.arange(40), version=2), "header version 2, expected 1"),
    (lambda p: write_llmc(p, np.arange(40), count=50), r"token count 50 needs 1,124 bytes .* has 1,104 \(truncated\)"),
    (lambda p: write_llmc(p, np.arange(40), count=30), r"token count 30 needs 1,084 bytes .* has 1,104 \(extra"),
    (lambda p: p.write_bytes(b"\0" * 100), "shorter than llm.c's 1024-byte header"),
])
def test_llmc_header_mismatches_are_one_line_each(tmp_path, write, message):
    write(tmp_path / "fw_train_000001.bin")
    with pytest.raises(ValueError, match=message) as e:
        ShardLoader(tmp_path, "train", B=1, T=8)
    assert "fw_train_000001.bin" in str(e.value) and "\n" not in str(e.value)


def test_no_shards_names_every_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'\*_train_\*\.npy' or '\*_train_\*\.bin'"):
        ShardLoader(tmp_path, "train", B=1, T=8)
