"""What start-up needs to know about a token shard (its token count and largest token id), kept so that no
start after the first reads a shard whole.

Checking a shard's ids means reading all of it (2 bytes a token; all of FineWeb-Edu sample-10BT's 1e10),
on every rank at every start and restart. So the result is recorded with a fingerprint of the file (its size and
a hash of a few sampled blocks, some KiB) and trusted while the fingerprint matches:

- data/fineweb.py writes the record of each shard it writes into manifest.json;
- shards without one (build-nanogpt, llm.c, nanoGPT files, or a manifest from before this) are read once and
  their records kept in .nanoact_shard_stats.json beside them, or, where that directory is read-only, in
  $NANOACT_CACHE/shards/ (default ~/.cache/nanoact). Once, not once per rank: the ranks starting together take
  turns behind a file lock beside the records (exclusive), so the first reads a shard and the others find its
  record; no collective, since every rank builds its own loader.

Start-up trusts a record whose size matches the file (a stat: data/loader.py reads nothing of a 100-shard
corpus); the loader compares the rest of the fingerprint when it first opens the shard. A fingerprint samples
the file: a shard rewritten in place with the same size and the same sampled blocks would be trusted; a new
preparation, a truncated or another copy changes it.
"""
import contextlib
import fcntl
import hashlib
import json
from pathlib import Path

from data.files import atomic_file, cache_root

BLOCK, BLOCKS = 4096, 8  # bytes read per shard: the first and last block and six between
SIDECAR = ".nanoact_shard_stats.json"


def fingerprint(path):
    """'SIZE:HASH' of a file: its byte size and a blake2b hash of BLOCKS sampled blocks (the whole of a small file)."""
    size = Path(path).stat().st_size
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= BLOCK * BLOCKS:
            h.update(f.read())
        else:
            for k in range(BLOCKS):
                f.seek(k * (size - BLOCK) // (BLOCKS - 1))
                h.update(f.read(BLOCK))
    return f"{size}:{h.hexdigest()}"


def record(path, tokens, max_token):
    """A shard's entry: what start-up checks (data/loader.py), and the fingerprint that makes it trustworthy."""
    return {"tokens": int(tokens), "max_token": int(max_token), "fingerprint": fingerprint(path)}


def complete(entry):
    """An entry with what start-up needs (manifests written before data/shard_stats.py lack it)."""
    return bool(entry) and "max_token" in entry and "fingerprint" in entry


def recorded_size(path, entry):
    """The entry (manifest or cache) when it records a file of this one's byte size (a stat, no read), else None.
    Start-up trusts it; the loader compares the whole fingerprint when it first opens the shard."""
    if complete(entry) and entry["fingerprint"].split(":")[0] == str(Path(path).stat().st_size):
        return entry
    return None


def trusted(path, entry):
    """True when the entry records this very file: the same fingerprint."""
    return complete(entry) and entry["fingerprint"] == fingerprint(path)


def _user_cache(data_dir):
    key = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    return cache_root().expanduser() / "shards" / f"{key}.json"


def cached(data_dir):
    """{shard file name: entry} recorded by earlier starts (beside the shards, then in the user's cache)."""
    entries = {}
    for path in (_user_cache(data_dir), Path(data_dir) / SIDECAR):
        try:
            entries.update(json.loads(path.read_text())["shards"])
        except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: the shards are read again
            pass
    return entries


@contextlib.contextmanager
def exclusive(data_dir):
    """Held while a process reads a shard whole and records it: the ranks of a node (of every node, where the
    records are on a shared filesystem) take turns, so the first reads it and the others find its record, and no
    two rewrite the records at once (an update lost). The lock file is beside the records: in the shard
    directory, else in the user's cache; where neither can be written there is no lock (and no record)."""
    for path in (Path(data_dir) / SIDECAR, _user_cache(data_dir)):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_name(path.name + ".lock"), "a")
        except OSError:
            continue
        with lock:
            # released when the file closes, also when the process dies; a filesystem without locks (NFS mounted
            # nolock: ENOLCK) leaves every rank to read for itself, as before the lock
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        return
    yield


def remember(data_dir, new):
    """Add {file: entry} to the records beside the shards, or to the user's cache where the directory is read-only.
    Returns where they went, or None when neither could be written (the next start reads them again)."""
    if not new:
        return None
    for path in (Path(data_dir) / SIDECAR, _user_cache(data_dir)):
        try:
            entries = {}
            if path.exists():
                entries = json.loads(path.read_text()).get("shards", {})
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, "w") as f:  # under exclusive(): no other process rewrites it meanwhile
                f.write(json.dumps({"shards": {**entries, **new}}, indent=1) + "\n")
            return path
        except (OSError, ValueError, AttributeError):
            continue
    return None
