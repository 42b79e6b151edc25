"""Before step 0: every input a run will need, resolved while nothing is spent yet.

A run that trains for hours and then dies at its first HellaSwag evaluation (offline compute node), or at its
first checkpoint (a full or read-only disk), has lost those hours. Both trainers therefore call resolve() after
building their parts and before the first step, with the checks of what they read later (the trainer's
`inputs` hook: HellaSwag's file and tokenizer, the translation test split) and of where they write (out_dir
writable, room for the checkpoints the run keeps). A check is a callable that raises a NanoactError whose one
line names the trainer's own option and the command that fetches what is missing (errors.py).

Every rank learns every failure: rank 0 checks first (a download lands once in the cache), then the others
(each reads its inputs where it runs: another node has its own cache); after each round one gather tells all
ranks, so each raises the same error at once and none is left waiting in a collective.
"""
import shutil
import tempfile
from pathlib import Path

import errors
from errors import ConfigError, NanoactError
from training import distributed
from training.checkpoint import list_checkpoints

ADAM_MOMENTS = 2  # AdamW keeps exp_avg and exp_avg_sq, each shaped as its parameter (training/optimizer.py)


def resolve(checks, d):
    """Run `checks` (callables) on rank 0, then on the other ranks; the first NanoactError of any rank is raised
    on every rank. Any other exception is a bug and keeps its traceback."""
    for turn in (True, False):
        problem = None
        if d.master == turn:
            try:
                for check in checks:
                    check()
            except NanoactError as e:
                problem = (type(e).__name__, str(e))
        found = [(rank, p) for rank, p in enumerate(distributed.gather_objects(problem, d)) if p is not None]
        if found:
            rank, (kind, message) = found[0]
            where = "" if rank == d.rank else f"rank {rank}: "
            raise getattr(errors, kind, NanoactError)(where + message)


def writable(out_dir):
    """A check: out_dir exists (created if not) and takes a file."""
    def check():
        try:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=out_dir):
                pass
        except OSError as e:
            raise ConfigError(f"--out-dir {out_dir}: cannot write there ({e.strerror or e}); choose a directory "
                              "this user may write to") from None
    return check


def checkpoint_bytes(model, optimizer):
    """What one training checkpoint weighs, near enough: the model's state (weights and buffers) and AdamW's two
    moments per trained parameter (its state is still empty before the first step); loader and RNG states and
    the pickle's framing add kilobytes."""
    # parameters() lists a tied weight (GPT-2's wte and lm_head) once, as torch.save stores it (a sharded
    # checkpoint stores it under both names, small next to AdamW's moments); a sharded parameter (FSDP) counts
    # whole, as all ranks' files together hold it
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    moments = sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"])
    return weights + ADAM_MOMENTS * moments


def checkpoints_written(start, max_steps, interval):
    """How many checkpoints a run from `start` to `max_steps` writes: every interval-th step before the end, and
    the end (training/loop.py)."""
    every = len(range(start + interval - start % interval, max_steps, interval)) if interval > 0 else 0
    return every + 1


def disk_room(out_dir, each, written, keep):
    """A check: the disk under out_dir holds the checkpoints the run will have at once. A save writes the new
    file before it deletes the oldest (training/checkpoint.py), so `keep` kept means keep + 1 at a time; the ones
    already there (a resume) count as kept. keep 0: all are kept."""
    def check():
        there = len(list_checkpoints(out_dir)) if Path(out_dir).is_dir() else 0
        new = written if not keep else max(1, min(written, keep + 1 - there))
        free = shutil.disk_usage(out_dir).free
        if new * each > free:
            raise ConfigError(
                f"--out-dir {out_dir}: {size(free)} free, but the run needs {size(new * each)} for the {new} new "
                f"checkpoint(s) it holds at once ({size(each)} each: weights and AdamW state; --keep-checkpoints "
                f"{keep}); free space there, lower --keep-checkpoints or choose another --out-dir")
    return check


def size(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def out_dir_checks(out_dir, model, optimizer, start, max_steps, interval, keep):
    """The checks of where a run writes: out_dir writable, then room there for its checkpoints."""
    return [writable(out_dir),
            disk_room(out_dir, checkpoint_bytes(model, optimizer), checkpoints_written(start, max_steps, interval),
                      keep)]
