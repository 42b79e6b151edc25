"""Checkpoints that survive crashes, bad disks and untrusted files.

A checkpoint is a dict with at least `kind` (which trainer made it), `model`, `model_config`,
`config` and `step`. Training checkpoints add `optimizer`, `loader`, `rng` (every rank's states)
and the logs' position, so that a resumed run continues bit-for-bit.

- Written atomically (temporary file, fsync, rename), with the sha256 of its bytes, computed while
  writing, in a sidecar `model_NNNNN.pt.sha256` (`sha256sum -c` reads it). After the rename the file is
  read back and checked before older checkpoints may be deleted, so --keep-checkpoints never removes
  the last verified one first. A failed save (disk full) removes its temporary files and raises.
- Loaded as data, never code: torch.load(weights_only=True). Everything we store is plain data (tensors,
  dicts, lists, numbers, strings); the only types allow-listed are numpy's array pieces, for the numpy
  RNG state of checkpoints written before it was stored as a list. A file that needs anything else is
  refused with one line naming the file and the callable it asked for.
- Checked on load: a sidecar that does not match means a corrupt or truncated file; --resume then takes
  the newest checkpoint that verifies (newest_good_checkpoint).
- A sharded model's (--dist fsdp) is a directory model_NNNNN.dcp/ that every rank writes its shards into
  (training/sharded_checkpoint.py): atomic, hashed and read as data the same way; a resume reads each rank's
  shards of it, the readers (load_checkpoint) the whole weights in one process.
"""
import hashlib
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from activations import mlp_activation
from activations.gated import hidden_width
from activations.impl import model_identity
from data.files import atomic_file, fsync_dir, remove_temporaries
from errors import CheckpointError, CheckpointNotFound
from training import distributed, fsdp, sharded_checkpoint
from training.config import listed_changes, option_paths, result_changes
from training.foreign_checkpoints import nanogpt_checkpoint_in, read_foreign_checkpoint

NAME = re.compile(r"^model_(\d+)\.(pt|dcp)$")  # a file, or a sharded checkpoint's directory
# np.random.get_state() as pickled by checkpoints written before the state was stored as a list
# (numpy 2 names the array constructor numpy._core..., numpy 1 numpy.core...)
_reconstruct = getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct
LEGACY_NUMPY_RNG = [np.ndarray, np.dtype, np.dtypes.UInt32DType, _reconstruct,
                    (_reconstruct, "numpy.core.multiarray._reconstruct")]


class CorruptCheckpoint(CheckpointError):
    """The bytes are damaged (checksum mismatch, truncated archive): an older checkpoint may still be good."""


class UnsafeCheckpoint(CheckpointError):
    """The file asks the unpickler for code: refused, never run."""


def checkpoint_path(out_dir, step):
    return Path(out_dir) / f"model_{step:05d}.pt"


def list_checkpoints(out_dir):
    """Finished checkpoints in out_dir (files and sharded directories), oldest first (temporary files of an
    interrupted save are ignored)."""
    found = [(int(m.group(1)), p) for p in Path(out_dir).glob("model_*") if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def listed_checkpoint(out_dir, step):
    """The checkpoint of `step` in out_dir, file or sharded directory."""
    return next((p for p in list_checkpoints(out_dir) if int(NAME.match(p.name).group(1)) == step),
                checkpoint_path(out_dir, step))


def is_sharded(path):
    return Path(path).suffix == sharded_checkpoint.SUFFIX


def remove_older(out_dir, keep_last):
    """Delete the checkpoints beyond the newest `keep_last` (after the newest was verified)."""
    for old in list_checkpoints(out_dir)[:-keep_last]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
            sidecar_path(old).unlink(missing_ok=True)


def sidecar_path(path):
    return path.with_name(path.name + ".sha256")


class _HashingWriter:
    """The file object torch.save writes to, hashing the bytes on their way: no second pass to checksum."""

    def __init__(self, f):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data):
        self.sha256.update(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


def save_checkpoint(state, out_dir, step, keep_last=None):
    """Save `state` as <out_dir>/model_<step>.pt with its checksum sidecar, then verify it; only then may
    checkpoints beyond the newest `keep_last` go. A crash at any point leaves every earlier checkpoint as it
    was; a failure (disk full) raises a one-line CheckpointError after removing its temporary files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out_dir)  # of a save that a kill -9 interrupted: each holds a whole checkpoint's bytes
    final = checkpoint_path(out_dir, step)
    try:
        with atomic_file(final, durable=True) as f:
            writer = _HashingWriter(f)
            torch.save(state, writer)
            # the sidecar's rename first: a crash between the renames leaves an old checkpoint with a new sidecar
            # (taken for corrupt, so an older one is used) or a sidecar alone (ignored), never a new file taken
            # as verified
            with atomic_file(sidecar_path(final), durable=True) as sidecar:
                sidecar.write(f"{writer.sha256.hexdigest()}  {final.name}\n".encode())
        fsync_dir(out_dir)
        verify_checksum(final)
    except (OSError, RuntimeError, CorruptCheckpoint) as e:
        if not final.is_file():
            sidecar_path(final).unlink(missing_ok=True)  # a checksum of a file that never arrived
        reason = e.strerror if isinstance(e, OSError) and e.strerror else \
            re.sub(r"^\[enforce fail at [^\]]*\][ .]*", "", str(e).splitlines()[0])
        # torch reports a full disk as "unexpected pos N vs M" (a short write): the free space tells
        free = f"{shutil.disk_usage(out_dir).free / 2**20:,.0f} MiB free there"
        previous = [p for p in list_checkpoints(out_dir) if p != final]
        raise CheckpointError(f"saving {final} failed ({reason}; {free}); earlier checkpoints are untouched (newest: "
                              f"{previous[-1].name if previous else 'none'}); free space or fix {out_dir}, "
                              "then continue with --resume") from None
    if keep_last:
        remove_older(out_dir, keep_last)
    return final


def verify_checksum(path):
    """True if the sidecar's sha256 matches the file's bytes, False if there is no sidecar (checkpoints of
    older versions, files from elsewhere); a mismatch raises CorruptCheckpoint."""
    recorded = sidecar_path(path)
    if not recorded.is_file():
        return False
    expected = (recorded.read_text().split() or [""])[0]
    with open(path, "rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual != expected:
        raise CorruptCheckpoint(f"{path}: corrupt or truncated: its sha256 {actual[:12]}... differs from "
                                f"{expected[:12] or 'nothing'}... recorded in {recorded.name} when it was saved")
    return True


def latest_checkpoint(out_dir):
    found = list_checkpoints(out_dir) if Path(out_dir).is_dir() else []
    return found[-1] if found else None


def read_checkpoint_file(path, map_location="cpu"):
    """What a checkpoint file holds, read as data only (weights_only=True), after checking its sidecar
    checksum when it has one. Errors are one line naming the file: CheckpointNotFound (missing),
    CorruptCheckpoint (damaged bytes) or UnsafeCheckpoint (the file would run code)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFound(f"{path}: no such checkpoint file (checkpoints are written as <out_dir>/model_NNNNN.pt)")
    verify_checksum(path)
    try:
        with torch.serialization.safe_globals(LEGACY_NUMPY_RNG):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        wanted = re.search(r"GLOBAL ([\w.]+)", str(e))
        if wanted is None:  # no callable asked for: bytes that are no (complete) pickle
            detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
            raise CorruptCheckpoint(f"{path}: not a readable PyTorch checkpoint (unpickling: "
                                    f"{detail.group(1) if detail else str(e).splitlines()[0]})") from None
        raise UnsafeCheckpoint(
            f"{path}: refused: loading it would call {wanted.group(1)}, which a checkpoint never needs "
            "(checkpoints are read as data only, torch.load weights_only=True); nothing was run") from None
    except Exception as e:  # torch raises many types for a truncated or foreign file
        raise CorruptCheckpoint(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: "
                                f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no detail'})") from None


REQUIRED = ("kind", "model", "model_config", "step")


def load_checkpoint(path, kind=None, map_location="cpu", weights=True, share=(0, 1)):
    """Load a checkpoint file (or the newest one in a directory) with one-line errors for bad input. A sharded
    checkpoint: its whole weights in this process as "model" (`weights`), else none, but its "shards" to read
    into a model of any layout; `share`: which of its files this process verifies (sharded_checkpoint)."""
    path = Path(path)
    if path.is_dir() and not is_sharded(path):
        newest = latest_checkpoint(path) or nanogpt_checkpoint_in(path)
        if newest is None:
            raise CheckpointNotFound(f"{path}: no model_*.pt checkpoint in this directory; train first or give a file")
        path = newest
    foreign = read_foreign_checkpoint(path, kind, map_location) if path.is_file() else None
    if foreign is not None:  # build-nanogpt / nanoGPT: converted to our layout, read as data only
        print(foreign["source"], flush=True)
        return foreign
    shards = None
    if is_sharded(path):
        try:
            path, shards = sharded_checkpoint.open_verified(path, share)
        except ValueError as e:
            raise CorruptCheckpoint(f"{path}: corrupt or incomplete sharded checkpoint ({e})") from None
    state = read_checkpoint_file(path, map_location)
    if shards is not None and isinstance(state, dict):
        path, state["shards"] = shards.path, shards
        state["model"] = shards.model_weights() if weights else None
    missing = [key for key in REQUIRED if key not in state] if isinstance(state, dict) else list(REQUIRED)
    if "kind" not in missing and kind is not None and state["kind"] != kind:
        raise CheckpointError(f"{path}: a {state['kind']!r} checkpoint, but this command needs a {kind!r} one")
    if missing:
        raise CheckpointError(f"{path}: not a nanoact checkpoint (no {', '.join(map(repr, missing))} "
                              "entries); for transformers GPT-2 weights use --hf DIR")
    state["path"] = str(path)
    pin_gated_width(state, shards.shapes() if shards else {k: v.shape for k, v in state["model"].items()})
    return state


def pin_gated_width(ckpt, shapes):
    """glu_hidden 0 means the width rule's, and the rule changed (2/3 rounded to 64, then the plain MLP's parameters
    within 0.5%: activations/gated.py). A gated checkpoint whose weights are not today's rule's width gets theirs
    as glu_hidden: it loads, and a resume or --init-from that would build another width says so in one line."""
    config = ckpt["model_config"]
    if config.get("glu_hidden") or not mlp_activation(config.get("act", "gelu"))[1]:
        return
    if ckpt["kind"] == "gpt2":
        up, shape = "transformer.h.0.mlp.c_up.weight", (config["n_embd"], 4 * config["n_embd"], config.get("bias", True))
    else:
        up, shape = "encoder.0.ffn.fc_up.weight", (config["d_model"], config["ffn_dim"], True)
    width = shapes[up][0]
    if width != hidden_width(shape[0], shape[1], True, bias=shape[2]):
        config["glu_hidden"] = width


def newest_good_checkpoint(out_dir, kind, d):
    """The newest checkpoint in out_dir that verifies and loads, the same one on every rank (collective).
    Returns (checkpoint or None if there are none, [one-line reasons for the newer ones skipped])."""
    ckpt, skipped = None, []
    for path in reversed(list_checkpoints(out_dir) if Path(out_dir).is_dir() else []):
        try:
            ckpt = load_checkpoint(path, kind, weights=False, share=(d.rank, d.world_size))
            break
        except CorruptCheckpoint as e:
            skipped.append(str(e))
    # All ranks must continue the same step. On a half-synced shared filesystem they may see different
    # files: all take the oldest choice. A rank that sees none while others do has another filesystem.
    found = distributed.gather_objects((ckpt["step"] if ckpt else -1, skipped), d)
    steps = [step for step, _ in found]
    if min(steps) < 0 <= max(steps):
        raise CheckpointError(f"ranks {[r for r, s in enumerate(steps) if s < 0]} find no usable checkpoint in "
                              f"{out_dir}, others do: put --out-dir on a filesystem every node shares")
    if min(steps) < 0:
        if any(reasons for _, reasons in found):
            reasons = sorted({r for _, rank_reasons in found for r in rank_reasons})
            raise CheckpointError(f"no checkpoint in {out_dir} can be used: {'; '.join(reasons)}; move the damaged "
                                  "files away to start afresh")
        return None, skipped
    if ckpt["step"] != min(steps):
        ckpt = load_checkpoint(listed_checkpoint(out_dir, min(steps)), kind, weights=False,
                               share=(d.rank, d.world_size))
    # every rank's reasons: a sharded checkpoint's files are checked a share per rank
    return ckpt, list(dict.fromkeys(r for _, rank_reasons in found for r in rank_reasons))


def save_training_checkpoint(state, loader, d, out_dir, step, keep_last=None, sharded=False):
    """Add every rank's loader and RNG states to `state` (collective: all ranks call it), save it on the
    master rank, and wait until it is on disk everywhere. Returns the path on the master, else None.
    `sharded`: state's model and optimizer states are each rank's shards (fsdp.training_states), written by
    every rank into a model_NNNNN.dcp directory."""
    state = {**state, "step": step, "world_size": d.world_size,
             "loader": distributed.gather_objects(loader.state_dict(), d),
             "rng": distributed.gather_objects(rng_state(), d)}
    if sharded:
        tensors = {"model": state.pop("model"), "optimizer": {"state": state["optimizer"]["state"]}}
        state["param_groups"] = state.pop("optimizer")["param_groups"]
        path = sharded_checkpoint.save(tensors, state, out_dir, step, d)
        if d.master:
            print(f"saved {path}", flush=True)
            if keep_last:
                remove_older(out_dir, keep_last)
        return path if d.master else None
    path = error = None
    if d.master:
        try:
            path = save_checkpoint(state, out_dir, step, keep_last)
            print(f"saved {path}", flush=True)
        except CheckpointError as e:
            error = e
    # every rank waits until the file is on disk, and a failed save stops them all (not a wait for rank 0)
    if distributed.any_rank(error is not None, d):
        raise error or CheckpointError(f"saving {checkpoint_path(out_dir, step)} failed on rank 0 (its log says why)")
    return path


# --resume-changes' name for another number of processes than the checkpoint's (not a config option)
WORLD_SIZE = "world_size"


def declares_world_size(cfg):
    """Whether --resume-changes names world_size: the run may resume a checkpoint of another world size."""
    return WORLD_SIZE in [name.strip() for name in cfg.run.resume_changes.split(",")]


def resumed_changes(ckpt, cfg, world_size=None):
    """The options this run changes from the checkpoint's, {dotted path: (old, new)}: only those named in
    --resume-changes. A resume is the same run: any other change its result depends on is refused in one line.
    `world_size`: this run's; another than the checkpoint's is a change named `world_size` when declared."""
    changes = result_changes(cfg, ckpt["config"])
    names = [n.strip() for n in cfg.run.resume_changes.split(",")]
    allowed = option_paths(type(cfg), ",".join(n for n in names if n != WORLD_SIZE), "--resume-changes")
    if declares_world_size(cfg) and world_size is not None and ckpt.get("world_size", world_size) != world_size:
        changes[WORLD_SIZE] = (ckpt["world_size"], world_size)
        allowed.add(WORLD_SIZE)
    refused = {path: change for path, change in changes.items() if path not in allowed}
    if refused:
        names = ",".join(path.rsplit(".", 1)[-1] for path in refused)
        raise CheckpointError(f"{ckpt.get('path', 'the checkpoint')} was trained with other options "
                              f"({listed_changes(refused)}); resume with its values, name the deliberate changes "
                              f"with --resume-changes {names} (recorded in run.json and metrics.jsonl), or use a new "
                              "--out-dir")
    return changes


def resume_training(ckpt, model_config, world_size, rank, model, optimizer, loader, resized=False):
    """Restore a training checkpoint into this process (model, optimizer, this rank's loader and RNG
    streams) after checking it was made by the same model and world size; returns its step. `resized`: another
    world size was declared (--resume-changes world_size): the loader's position is global (data/loader.py), so
    every rank continues the stream from it; a rank the checkpoint did not have takes rank 0's RNG states."""
    path = ckpt.get("path", "the checkpoint")
    if "source" in ckpt:  # build-nanogpt / nanoGPT: weights, but no data position or RNG states to continue
        raise CheckpointError(f"{path} was written by another harness and cannot be resumed exactly; start from its "
                              f"weights with --init-from {path} and another --out-dir")
    # impl is a speed option and may change. A field added to the model config since the checkpoint was written
    # (glu_hidden) compares at the run's value: the old model had none, and load_state_dict refuses another shape
    if model_identity({**model_config, **ckpt["model_config"]}) != model_identity(model_config):
        raise CheckpointError(f"{path} was trained with model config {ckpt['model_config']}; "
                              "resume with the same model options or use a new --out-dir")
    if ckpt["world_size"] != world_size and not resized:
        raise CheckpointError(f"{path} was written by {ckpt['world_size']} processes; resume with the same "
                              "world size so data order and RNG streams continue exactly, or declare the change "
                              f"with --resume-changes {WORLD_SIZE} (the data stream continues; sums over ranks "
                              "change order)")
    if ckpt.get("shards") is not None:
        fsdp.load_sharded_training_states(model, optimizer, ckpt["shards"].read_into, ckpt["param_groups"])
    else:
        fsdp.load_training_states(model, optimizer, ckpt["model"], ckpt["optimizer"])
    saved = rank if rank < ckpt["world_size"] else 0
    loader.load_state_dict(ckpt["loader"][saved])
    set_rng_state(ckpt["rng"][saved])
    return ckpt["step"]


def rng_state():
    name, keys, pos, has_gauss, cached = np.random.get_state()
    # plain data, so that checkpoints load with weights_only=True and need no allow-list
    state = {"python": random.getstate(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

