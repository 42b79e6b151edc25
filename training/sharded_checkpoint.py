"""Sharded checkpoints (--dist fsdp): every rank writes its own shards of the weights and AdamW's moments through
torch.distributed.checkpoint (DCP), so that no process ever holds the whole training state; DCP's planners reshard
on load, onto any world size or one process.

A checkpoint is a directory `model_NNNNN.dcp/`:
    __R_0.distcp   rank R's tensors (DCP's files: torch.save of each tensor, read with weights_only=True)
    state.pt       the rest, written by rank 0: config, step, loader positions, RNG states, the optimizer's
                   param_groups (torch.save of plain data, read as data as training/checkpoint.py reads a .pt)
    index.json     DCP's metadata (which chunk of which tensor lies where) and every file's sha256

DCP's own FileSystemWriter/Reader keep the metadata in `.metadata`, written with pickle.dump and read with
pickle.load (torch 2.13, torch/distributed/checkpoint/filesystem.py), and its DefaultLoadPlanner loads non-tensor
entries with torch.load(weights_only=False): code, where a checkpoint must be data. Here the metadata is JSON
(JsonIndexWriter keeps it in memory, JsonIndexReader is given it), only tensors go through DCP (a non-tensor entry
is refused on save and on load), and everything else is in state.pt.

Atomic and verified as a .pt checkpoint: the ranks write into a hidden temporary directory; each hashes its own
files after DCP's fsync, rank 0 writes state.pt and index.json and renames the directory into place. A reader
checks the hashes (on a resume each rank checks its share of the files) before it loads.
"""
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import torch

from data.files import fsync_dir
from errors import CheckpointError
from training import distributed

SUFFIX = ".dcp"
INDEX, STATE = "index.json", "state.pt"
FORMAT = "nanoact sharded checkpoint 1"


def _dcp():
    """DCP's modules, imported where used (about a CPU-second: training/fsdp.py)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import filesystem, metadata, planner

    return dcp, filesystem, metadata, planner


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dtype(name):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def metadata_to_json(md):
    """DCP's Metadata as plain data: each tensor's dtype, size and chunks, and where each chunk's bytes lie."""
    _, filesystem, metadata, _ = _dcp()
    tensors = {}
    for fqn, entry in md.state_dict_metadata.items():
        if not isinstance(entry, metadata.TensorStorageMetadata):
            raise CheckpointError(f"{fqn}: not a tensor; a sharded checkpoint stores tensors only (the rest: "
                                  "state.pt)")
        tensors[fqn] = {"dtype": str(entry.properties.dtype).removeprefix("torch."), "size": list(entry.size),
                        "chunks": [[list(c.offsets), list(c.sizes)] for c in entry.chunks]}
    storage = []
    for index, info in md.storage_data.items():
        if info.transform_descriptors:
            raise CheckpointError(f"{index.fqn}: DCP stream transforms are not supported here")
        storage.append({"fqn": index.fqn, "offset": None if index.offset is None else list(index.offset),
                        "index": index.index, "file": info.relative_path, "start": info.offset,
                        "length": info.length})
    return {"version": md.version, "tensors": tensors, "storage": storage,
            "planner_data": {k: list(v) for k, v in (md.planner_data or {}).items()}}


def metadata_from_json(data, files):
    """The Metadata that metadata_to_json wrote; `files`: the directory's hashed files, the only ones it names."""
    _, filesystem, metadata, _ = _dcp()
    tensors = {fqn: metadata.TensorStorageMetadata(
        metadata.TensorProperties(dtype=_dtype(t["dtype"])), torch.Size(t["size"]),
        [metadata.ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in t["chunks"]])
        for fqn, t in data["tensors"].items()}
    storage = {}
    for s in data["storage"]:
        if s["file"] not in files:
            raise ValueError(f"{s['fqn']} lies in {s['file']!r}, a file the index does not list")
        storage[metadata.MetadataIndex(s["fqn"], s["offset"], s["index"])] = filesystem._StorageInfo(
            s["file"], int(s["start"]), int(s["length"]))
    return metadata.Metadata(tensors, planner_data={k: tuple(v) for k, v in data["planner_data"].items()},
                             storage_data=storage, storage_meta=metadata.StorageMeta(), version=data["version"])


def _writer_class():
    _, filesystem, _, _ = _dcp()

    class JsonIndexWriter(filesystem.FileSystemWriter):
        """DCP's file writer, but finish() keeps the metadata (save() writes it as JSON) instead of pickling it."""
        metadata = None

        def finish(self, metadata, results):
            metadata.version = filesystem.CURRENT_DCP_VERSION
            metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
            self.metadata = metadata

    return JsonIndexWriter


def _reader_class():
    _, filesystem, _, planner = _dcp()

    class JsonIndexReader(filesystem.FileSystemReader):
        """DCP's file reader given the metadata read from index.json; tensors only (weights_only=True)."""

        def __init__(self, path, metadata):
            super().__init__(path)
            self.metadata = metadata

        def read_metadata(self, *args, **kwargs):
            self.metadata.storage_meta.load_id = self.load_id
            return self.metadata

        def read_data(self, plan, planner_):
            if any(item.type == planner.LoadItemType.BYTE_IO for item in plan.items):
                raise CheckpointError(f"{self.path}: non-tensor entries are not read from shards (they would be "
                                      "unpickled); they belong in state.pt")
            return super().read_data(plan, planner_)

    return JsonIndexReader


def save(tensors, rest, out_dir, step, d):
    """Write `tensors` (nested dicts of tensors and DTensors: each rank passes its own) and `rest` (rank 0's plain
    data) as <out_dir>/model_<step>.dcp; collective. Returns the path; a failure on any rank raises a one-line
    CheckpointError on every rank, earlier checkpoints untouched."""
    dcp, _, _, _ = _dcp()
    out_dir = Path(out_dir)
    final = out_dir / f"model_{step:05d}{SUFFIX}"
    tmp = out_dir / f".{final.name}.tmp0"  # one name for every rank: they all write into it
    error = None
    try:
        if d.master:
            shutil.rmtree(tmp, ignore_errors=True)  # of a save that a kill -9 interrupted
            tmp.mkdir(parents=True)
    except OSError as e:
        error = e
    if not distributed.any_rank(error is not None, d):
        try:
            writer = _writer_class()(tmp, sync_files=True)
            dcp.save(tensors, storage_writer=writer)
            # read back after DCP's fsync: the hashes are of what is on disk
            mine = {p.name: _sha256(p) for p in sorted(tmp.glob(f"__{d.rank}_*"))}
        except Exception as e:  # DCP reports a failed write on any rank as one CheckpointException on all
            error, mine = e, None
        hashes = distributed.gather_objects(mine, d)  # None from a rank that failed: nothing is renamed
        if d.master and None not in hashes:
            try:
                _finish(tmp, final, rest, writer.metadata, {k: v for h in hashes for k, v in h.items()}, step)
            except (OSError, RuntimeError, CheckpointError) as e:
                error = e
    if distributed.any_rank(error is not None, d):
        if d.master:
            shutil.rmtree(tmp, ignore_errors=True)
        text = str(error).strip() if error is not None else ""
        reason = text.splitlines()[0] if text else "on another rank"
        free = f"{shutil.disk_usage(out_dir).free / 2**20:,.0f} MiB free there" if out_dir.is_dir() else ""
        raise CheckpointError(f"saving {final} failed ({reason}; {free}); earlier checkpoints are untouched; free "
                              f"space or fix {out_dir}, then continue with --resume")
    return final


def _finish(tmp, final, rest, metadata, hashes, step):
    """Rank 0: state.pt, index.json, then the directory renamed into place (durably)."""
    with open(tmp / STATE, "wb") as f:
        torch.save(rest, f)
        f.flush()
        os.fsync(f.fileno())
    hashes[STATE] = _sha256(tmp / STATE)
    index = {"format": FORMAT, "step": step, "files": hashes, "dcp": metadata_to_json(metadata)}
    with open(tmp / INDEX, "w") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    if final.exists():  # this step saved before (a restart): the old copy goes only once the new one is complete
        old = final.with_name(f".{final.name}.old0")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


class Shards:
    """A verified sharded checkpoint's tensors, read on demand: `read_into` fills a state of this run's layout."""

    def __init__(self, path, metadata):
        self.path, self.metadata = Path(path), metadata

    def shapes(self, prefix="model."):
        """{name: size} of the tensors under `prefix` (the model's weights by default)."""
        return {k[len(prefix):]: tuple(v.size) for k, v in self.metadata.state_dict_metadata.items()
                if k.startswith(prefix)}

    def read_into(self, state, no_dist=False):
        """Fill `state` (nested dicts as save() wrote them; tensors or DTensors of any sharding) in place:
        collective unless no_dist. DCP's planner reads each rank's chunks of the saved pieces."""
        dcp, _, _, _ = _dcp()
        with warnings.catch_warnings():  # DCP's note that no_dist loads in one process: what it is asked
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, storage_reader=_reader_class()(self.path, self.metadata), no_dist=no_dist)

    def model_weights(self):
        """{name: tensor} of the model's weights, whole, in this process (the readers': hellaswag, sample, ...)."""
        saved = self.metadata.state_dict_metadata
        weights = {name: torch.empty(size, dtype=saved["model." + name].properties.dtype)
                   for name, size in self.shapes().items()}
        self.read_into({"model": weights}, no_dist=True)
        return weights


def open_verified(path, share=(0, 1)):
    """(the path of state.pt, Shards) of the checkpoint directory `path`, after checking the sha256 of state.pt and
    of the tensor files in `share` = (k, n): every n-th from the k-th (a resume splits the check over its ranks).
    A missing, altered or malformed file raises ValueError (training/checkpoint.py: a CorruptCheckpoint)."""
    path = Path(path)
    try:
        index = json.loads((path / INDEX).read_text())
        files = index["files"]
        names = sorted(name for name in files if name != STATE)
        for name in [STATE, *names[share[0]::share[1]]]:
            if Path(name).name != name:
                raise ValueError(f"file {name!r} outside the checkpoint")
            actual = _sha256(path / name)
            if actual != files[name]:
                raise ValueError(f"{name}'s sha256 {actual[:12]}... differs from {files[name][:12]}... in {INDEX}")
        return path / STATE, Shards(path, metadata_from_json(index["dcp"], files))
    except (OSError, KeyError, TypeError) as e:
        raise ValueError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
