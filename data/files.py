"""Writing a file so that a crash never leaves a half-written one under its final name."""
import contextlib
import os
import re
from pathlib import Path

TEMPORARY = re.compile(r"^\..+\.tmp\d+$")


@contextlib.contextmanager
def atomic_file(path, mode="wb", durable=False):
    """Yield a hidden temporary file beside `path` (`.NAME.tmpPID`: no glob of ours matches it, and concurrent
    processes never share one); when the block ends it replaces `path` in one rename, after an fsync if
    `durable` (checkpoints: the bytes are on disk before the name points at them). On an exception the
    temporary file is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path):
    """Make the renames into directory `path` durable (POSIX: the directory entry is data of its own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temporaries(directory):
    """Delete the temporary files a killed writer left in `directory` (kill -9 runs no cleanup, and the next
    writer has another pid, so nothing else would). Only for a directory this process alone writes: a run's
    out_dir on its master rank, a shard directory being prepared."""
    if Path(directory).is_dir():
        for path in Path(directory).iterdir():
            if TEMPORARY.match(path.name):
                path.unlink(missing_ok=True)


def cache_root():
    """nanoact's cache folder (HellaSwag's data and tokens, shard statistics, kernel verdicts): $NANOACT_CACHE,
    else $XDG_CACHE_HOME/nanoact, else ~/.cache/nanoact. activations/policy.py restates this rule: activations/
    imports nothing from data/."""
    return Path(os.environ.get("NANOACT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "nanoact")
