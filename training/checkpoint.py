"""Checkpoints that survive crashes: written atomically, the last N kept, the newest found for --resume.

A checkpoint is a dict with at least `kind` (which trainer made it), `model`, `model_config`,
`config` and `step`. Training checkpoints add `optimizer`, `loader`, `rng` (every rank's states)
and the logs' position, so that a resumed run continues bit-for-bit.
"""
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from model import GPT, GPTConfig
from training import distributed
from training.foreign_checkpoints import nanogpt_checkpoint_in, read_foreign_checkpoint

NAME = re.compile(r"^model_(\d+)\.pt$")


class CheckpointError(ValueError):
    pass


def checkpoint_path(out_dir, step):
    return Path(out_dir) / f"model_{step:05d}.pt"


def list_checkpoints(out_dir):
    """Finished checkpoints in out_dir, oldest first (temporary files of an interrupted save are ignored)."""
    found = [(int(m.group(1)), p) for p in Path(out_dir).glob("model_*.pt") if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(state, out_dir, step, keep_last=None):
    """torch.save to a temporary file in the same directory, fsync, then rename over the final name:
    a crash leaves either the old set of checkpoints or the new one, never a truncated file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(out_dir, step)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(out_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    if keep_last:
        for old in list_checkpoints(out_dir)[:-keep_last]:
            old.unlink(missing_ok=True)
    return final


def latest_checkpoint(out_dir):
    found = list_checkpoints(out_dir) if Path(out_dir).is_dir() else []
    return found[-1] if found else None


def load_checkpoint(path, kind=None, map_location="cpu"):
    """Load a checkpoint file (or the newest one in a directory) with one-line errors for bad input."""
    path = Path(path)
    if path.is_dir():
        newest = latest_checkpoint(path) or nanogpt_checkpoint_in(path)
        if newest is None:
            raise CheckpointError(f"{path}: no model_*.pt checkpoint in this directory; train first or give a file")
        path = newest
    foreign = read_foreign_checkpoint(path, kind, map_location) if path.is_file() else None
    if foreign is not None:  # build-nanogpt / nanoGPT: converted to our layout, read as data only
        print(foreign["source"], flush=True)
        return foreign
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file (checkpoints are written as <out_dir>/model_NNNNN.pt)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # torch raises many types for a truncated or foreign file
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or "kind" not in state or "model" not in state:
        raise CheckpointError(f"{path}: not a nanoact checkpoint (no 'kind'/'model' entries); "
                              "for transformers GPT-2 weights use --hf DIR")
    if kind is not None and state["kind"] != kind:
        raise CheckpointError(f"{path}: a {state['kind']!r} checkpoint, but this command needs a {kind!r} one")
    state["path"] = str(path)
    return state


def load_gpt(path, device="cpu"):
    """A nanoact GPT-2 checkpoint (file, or run directory -> newest) as (model in eval mode, checkpoint dict)."""
    ckpt = load_checkpoint(path, kind="gpt2")
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt


def save_training_checkpoint(state, loader, d, out_dir, step, keep_last=None):
    """Add every rank's loader and RNG states to `state` (collective: all ranks call it), save it on the
    master rank, and wait until it is on disk everywhere. Returns the path on the master, else None."""
    state = {**state, "step": step, "world_size": d.world_size,
             "loader": distributed.gather_objects(loader.state_dict(), d),
             "rng": distributed.gather_objects(rng_state(), d)}
    path = save_checkpoint(state, out_dir, step, keep_last) if d.master else None
    if path is not None:
        print(f"saved {path}", flush=True)
    if d.ddp:
        torch.distributed.barrier()
    return path


def resume_training(ckpt, model_config, world_size, rank, model, optimizer, loader):
    """Restore a training checkpoint into this process (model, optimizer, this rank's loader and RNG
    streams) after checking it was made by the same model and world size; returns its step."""
    path = ckpt.get("path", "the checkpoint")
    if "source" in ckpt:  # build-nanogpt / nanoGPT: weights, but no data position or RNG states to continue
        raise CheckpointError(f"{path} was written by another harness and cannot be resumed exactly; start from its "
                              f"weights with --init-from {path} and another --out-dir")
    if ckpt["model_config"] != model_config:
        raise CheckpointError(f"{path} was trained with model config {ckpt['model_config']}; "
                              "resume with the same model options or use a new --out-dir")
    if ckpt["world_size"] != world_size:
        raise CheckpointError(f"{path} was written by {ckpt['world_size']} processes; resume with the same "
                              "world size so data order and RNG streams continue exactly")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"][rank])
    set_rng_state(ckpt["rng"][rank])
    return ckpt["step"]


def rng_state():
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def unwrap(model):
    """The plain nn.Module under DDP and torch.compile wrappers (their state-dict keys carry prefixes)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
