"""Which path each kernel family of a run takes: decided once, where a crash cannot hurt, and kept.

    select(model, shape, platform, device, dtype, compiled, dist_info, recorded, cache, reprobe)

is the one entry point, what the trainers call after building (and resuming) the model, before compile and
DDP. For each kernel family of the model (aglu, apa, nswish, nrelu, their per-instance forms), in this order:

  1. a platform that cannot run the kernels (not CUDA, no Triton, sm < 7.0): the PyTorch path, silently;
  2. a recorded decision (the checkpoint being resumed, or --kernels-from: a sweep's first seed of the arm)
     made under this run's key: reused as it is, nothing checked or timed. Under another key: one line
     saying what changed, then 3;
  3. the verdict cached on disk for this key (--kernel-cache, else $NANOACT_CACHE, $XDG_CACHE_HOME/nanoact
     or ~/.cache/nanoact): reused without a probe; a cached "no" is printed as such, with its date.
     --kernel-reprobe ignores verdicts written before this run started, and recorded decisions;
  4. a child process (forked from multiprocessing's fork server, which never touches CUDA: its own CUDA context)
     runs selfcheck.probe: the check, then both paths at the run's shape, values compared, then timed. An
     exception, wrong values, death by a signal or no answer in time is a "no": the PyTorch path, and
     one line naming the activation, the GPU and what happened. In time: PROBE_TIMEOUT, and all of a rank's
     probes together within probe_bound(--dist-timeout), since the vote's collective (below) waits that long
     for a rank still probing; a probe that this bound cut short is not cached. A kernel that has not passed
     never runs in this process: an out-of-bounds access leaves a sticky CUDA error that no fallback survives.
     The ranks of a node probe one at a time (a file lock beside the verdict), so each finds the first one's
     verdict in the cache.

The key is what a verdict depends on: GPU name and capability, driver, torch, Triton, the hash of the kernels'
and the check's source, dtype, the MLP shape and whether the run compiles. The ranks then agree with one
all_reduce (a "no" on any rank is a "no" everywhere; timings are summed), each module's impl is fixed to the
outcome, and the decisions ({family: impl, reason, triton_ms, torch_ms, key, source}) go into run.json and into
every checkpoint, for the resume to reuse.
"""
import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import multiprocessing
import os
import signal
import subprocess
import time
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist

import activations
from activations import impl, selfcheck
from activations.aglu import APA
from activations.anact import _NormalizedActivation

PROBE_TIMEOUT = 600.0  # seconds for one family's child: Python and torch start-up, check, compiling both paths, timing
# the share of --dist-timeout a rank's probes may take together: the others enter the vote's all_reduce at once
# (their verdicts cached) and wait at most --dist-timeout; the rest is for waiting on a lock and reading verdicts
PROBE_SHARE = 0.8


# device types where select_fused probes the fused MLP: the tests that let "auto" take the kernels on CPU tensors
# (impl.KERNEL_DEVICES) leave it out, its interpreted probe costing seconds; one adds "cpu" here
FUSED_DEVICES = ("cuda",)


def probe_bound(dist_timeout):
    """Seconds all of a rank's probes may take, so that the vote's collective never times out on the others."""
    return min(PROBE_TIMEOUT, PROBE_SHARE * dist_timeout)
HASHED = ("kernels.py", "selfcheck.py", "fused_mlp.py", "pointwise.py")  # a change to the kernels or to what proves
# them invalidates every verdict


def kernel_hash():
    digest = hashlib.sha256()
    for name in HASHED:
        path = Path(__file__).with_name(name)
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()[:16]


def driver_version():
    """The NVIDIA driver's version (CUDA's number where torch exposes it, else nvidia-smi's), or None."""
    exposed = getattr(torch._C, "_cuda_getDriverVersion", None)
    if exposed is not None:
        return exposed()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0] if out else None


def decision_key(platform, dtype, shape, compiled):
    """What a verdict depends on, as plain data (it is compared with keys read back from JSON and checkpoints)."""
    return {"gpu": platform.name, "capability": list(platform.capability) if platform.capability else None,
            "driver": driver_version() if platform.device_type == "cuda" else None, "torch": str(torch.__version__),
            "triton": platform.triton, "kernels": kernel_hash(), "dtype": str(dtype).replace("torch.", ""),
            "shape": list(shape), "compiled": bool(compiled)}


def key_change(old, new):
    if not old:
        return "no key was recorded with it"
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


# ---------------------------------------------------------------- the child process
def _child(work, args, send):
    try:
        result = work(*args)
    except BaseException as e:  # noqa: BLE001 - whatever stopped the probe is the parent's reason to say no
        text = str(e).strip()
        send.send(("error", f"{type(e).__name__}: {text.splitlines()[0] if text else 'no message'}"[:400]))
    else:
        send.send(("ok", result))
    send.close()


def run_child(work, args, timeout):
    """work(*args) in a child process (work module-level, picklable): (its result, None), or (None, one line
    saying what happened: the exception, the signal that killed it, its exit code, or the timeout). `timeout`
    bounds the whole: an answering child that does not exit is killed at it."""
    # fork would share this process's CUDA state, and spawn pays Python's and torch's start-up per family: the fork
    # server is a fresh process that imports torch and the kernels once, then forks one clean child per family (it
    # lives as long as this process). It preloads no more than that: the run's main script, which each child still
    # imports as a spawned one did, may ask torch.cuda at import (bench/gpu_check.py does), and CUDA initialized
    # in the server would be unusable in every forked child.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["activations.policy"])
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(work, args, send), name="nanoact-kernel-probe")
    deadline = time.monotonic() + timeout
    child.start()
    send.close()
    message = None
    try:
        # readable on an answer, and on EOF when the child died; the fork server's first start (torch's import)
        # took part of the time
        if not wait([receive], max(0.0, deadline - time.monotonic())):
            child.kill()
            child.join()
            return None, f"no answer within {math.ceil(timeout)} s (the probe was killed)"
        with contextlib.suppress(EOFError):
            message = receive.recv()
    finally:
        receive.close()
    child.join(timeout=max(0.0, deadline - time.monotonic()))
    if child.is_alive():  # answered but does not exit (a driver stuck in teardown): its answer stands
        child.kill()
        child.join()
    if message is None:
        code = child.exitcode
        if code is not None and code < 0:
            return None, f"the probe process died by signal {signal.Signals(-code).name}"
        return None, f"the probe process exited with code {code} without an answer"
    status, value = message
    return (value, None) if status == "ok" else (None, value)


# ---------------------------------------------------------------- the verdict cache
def cache_dir(option=None):
    base = option or os.environ.get("NANOACT_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nanoact"
    return Path(base) / "kernels"


def verdict_path(directory, name, key):
    digest = hashlib.sha256(json.dumps({"family": name, **key}, sort_keys=True).encode()).hexdigest()[:20]
    return Path(directory) / f"{name.replace('/', '-')}-{digest}.json"


def _read_verdict(path, key, since):
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if found.get("key") != key or (since is not None and found.get("time", 0) < since):
        return None
    return found


@contextlib.contextmanager
def _lock(path):
    """Exclusive use of `path`'s verdict on this machine, or no lock where the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path.with_name(path.name + ".lock"), "w")
    except OSError:
        yield False
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes, also if this process dies
        yield True


def verdict(name, args, key, directory, since, deadline, work):
    """The cached verdict of family `name` under `key` (none older than `since`), else a new one from a child
    running work(*args) until PROBE_TIMEOUT or the `deadline` (time.monotonic()), cached unless the deadline cut
    it short (a longer --dist-timeout may see it pass): {ok, reason, triton_ms, torch_ms, date, time, cached}."""
    path = verdict_path(directory, name, key)
    with _lock(path) as writable:
        cached = _read_verdict(path, key, since)
        if cached is not None:
            return {**cached, "cached": True}
        timeout = min(PROBE_TIMEOUT, max(0.0, deadline - time.monotonic()))
        ms, failure = run_child(work, args, timeout)
        cut_short = failure is not None and timeout < PROBE_TIMEOUT and time.monotonic() >= deadline
        now = time.time()
        new = {"family": name, "key": key, "ok": failure is None, "reason": failure,
               "triton_ms": ms["triton"] if ms else None, "torch_ms": ms["torch"] if ms else None, "time": now,
               "date": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        if writable and not cut_short:
            with contextlib.suppress(OSError):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(new, indent=1))
                os.replace(tmp, path)
        return {**new, "cached": False}


# ---------------------------------------------------------------- the decision
def _local(name, module, key, old, where, probe_args, master):
    """This rank's (reason it cannot use the kernel or None, timings or None, source) for family `name`."""
    if old is not None:
        if old.get("key") == key:
            ms = {"triton": old["triton_ms"], "torch": old["torch_ms"]} if old.get("triton_ms") is not None else None
            return (None if ms else old["reason"]), ms, "recorded"
        if master:
            print(f"{name}: the recorded kernel decision was made for another setting "
                  f"({key_change(old.get('key'), key)}); deciding again", flush=True)
    shape, device, dtype, compiled, directory, since, deadline, work = probe_args
    state = {k: v.tolist() for k, v in module.state_dict().items()}  # plain data: the child rebuilds the module
    v = verdict(name, (name, state, shape, str(device), dtype, compiled), key, directory, since, deadline, work)
    source = f"cached {v['date']}" if v["cached"] else "probed"
    if not v["ok"]:
        return f"the Triton kernel failed its check on {where}: {v['reason']}", None, source
    return None, {"triton": v["triton_ms"], "torch": v["torch_ms"]}, source


SOURCES = {"recorded": "the recorded decision, not timed again", "probed": "probed in a child process", "platform": ""}


def select(model, shape, platform, device, dtype, compiled, dist_info=None, recorded=None, cache=None,
           reprobe=False, timeout=PROBE_TIMEOUT, work=None, fused_work=None, fuse=True):
    """Fix impl on every impl="auto" parametric activation of `model`: the Triton kernels where they pass on
    every rank and are faster at `shape` = (rows, width) of the MLP, else the PyTorch path. `recorded`: the
    decisions of a checkpoint or an earlier run, reused where their key is this run's; `cache`: the verdict
    directory (default cache_dir()); `reprobe`: ignore both; `timeout`: seconds all its probes may take together
    (the trainers': probe_bound(--dist-timeout)); `work`: what the child runs (selfcheck.probe). Then
    select_fused (`fused_work`: its child's work; `fuse=False`, --fused-mlp false, keeps every MLP unfused), whose
    records join these under "mlp/NAME".
    Prints one line per family on a CUDA platform; returns {family: {"impl", "reason", "triton_ms",
    "torch_ms", "key", "source"}} for run.json and checkpoints. Every rank must call it (one all_reduce under
    DDP, whatever the platform, so ranks on different hardware still agree)."""
    groups = {}
    for m in model.modules():
        if getattr(m, "impl", None) == "auto" and isinstance(m, (APA, _NormalizedActivation)):
            groups.setdefault(selfcheck.family(m), []).append(m)
    fused = (model, shape, platform, device, dtype, compiled, dist_info, recorded, cache, reprobe, timeout, fused_work)
    if not groups:
        return select_fused(*fused) if fuse else {}
    master = dist_info is None or dist_info.master
    blocked = selfcheck.blocker(platform)
    where = f"{platform.name}, {str(dtype).replace('torch.', '')}"
    key = decision_key(platform, dtype, shape, compiled)
    since, recorded = (time.time(), {}) if reprobe else (None, recorded or {})
    deadline = time.monotonic() + timeout
    probe_args = (tuple(shape), device, dtype, compiled, cache_dir(cache), since, deadline, work or selfcheck.probe)
    local = {}  # family -> (reason it cannot use the kernels here or None, timings or None, source)
    for name, modules in groups.items():
        reason, ms, source = blocked, None, "platform"
        if name is None:
            reason = "channelwise parameters always take the PyTorch path"
        elif blocked is None and name.endswith("/per_instance") and shape[1] > (rows := impl.loaded_kernels().MAX_ROW):
            reason = f"rows of {shape[1]} exceed the per-instance kernel's {rows}"
        if reason is None:
            reason, ms, source = _local(name, modules[0], key, recorded.get(name), where, probe_args, master)
            if reason is not None and not master:  # rank 0 prints the decision; this rank says why it voted no
                print(f"rank {dist_info.rank}: {name}: {reason}", flush=True)
        local[name] = (reason, ms, source)

    names = list(groups)
    decisions = {}
    world = dist_info.world_size if dist_info is not None else 1
    for name, (failed, triton_ms, torch_ms) in zip(names, _vote(local, names, dist_info)):
        reason, _, source = local[name]
        record = {"impl": "torch", "reason": reason, "triton_ms": None, "torch_ms": None, "key": key,
                  "source": source}
        if failed == 0:
            t, p = triton_ms / world, torch_ms / world
            record.update(impl="triton" if t <= p else "torch", triton_ms=t, torch_ms=p,
                          reason=f"Triton {t:.3f} ms vs PyTorch {p:.3f} ms, {'compiled' if compiled else 'eager'} "
                                 f"fwd+bwd at {shape[0]}x{shape[1]} on {where}")
        elif reason is None:
            record["reason"] = f"the Triton kernel failed on {int(failed)} other rank(s) (their lines say why)"
        for m in groups[name]:
            m.impl = record["impl"]
        if name is not None:  # "auto" modules outside this model (an evaluation's copy) follow the decision
            impl.TRUSTED[(name, str(torch.device(device)), dtype)] = record["impl"] == "triton"
        decisions[name or "channelwise"] = record
        if master and platform.device_type in impl.KERNEL_DEVICES:
            label = "Triton kernel" if record["impl"] == "triton" else "PyTorch path"
            how = SOURCES.get(source, f"verdict {source}; --kernel-reprobe probes again")
            print(f"{name or 'channelwise'}: {label} ({record['reason']}{'; ' + how if how else ''})", flush=True)
    if not fuse:
        return decisions
    return {**decisions, **select_fused(*fused[:-2], max(0.0, deadline - time.monotonic()), fused_work)}


def _vote(local, names, dist_info):
    """Per family (ranks that cannot use it, summed Triton or fused ms, summed PyTorch or unfused ms) over the
    ranks: one all_reduce (a "no" on any rank is a "no" everywhere)."""
    votes = torch.tensor([[float(local[n][0] is not None), *(local[n][1] or {"triton": 0.0, "torch": 0.0}).values()]
                          for n in names], dtype=torch.float64)
    if dist_info is not None and dist_info.ddp:
        on = votes.to(dist_info.device) if dist_info.device_type == "cuda" else votes
        dist.all_reduce(on, op=dist.ReduceOp.SUM)
        votes = on.cpu()
    return votes.tolist()


def fused_groups(model):
    """{"mlp/NAME" or "mlp/NAME_glu" (gated): [the MLPs whose activation NAME has a fused form (fused_mlp.py)]}:
    model.py's MLP and translation/model.py's FFN, unless it says it is not `fusable` (dropout on its hidden tensor)."""
    fused = activations.load_fused_mlp()
    groups = {}
    for m in model.modules():
        if all(hasattr(m, a) for a in ("c_fc", "act", "c_proj")) and getattr(m, "fusable", True):
            name, _ = fused.fused_kind(m.act)
            if name is not None:
                gated = activations.GLU_SUFFIX if getattr(m, "c_up", None) is not None else ""
                groups.setdefault(f"mlp/{name}{gated}", []).append(m)
    return groups


def select_fused(model, shape, platform, device, dtype, compiled, dist_info=None, recorded=None, cache=None,
                 reprobe=False, timeout=PROBE_TIMEOUT, work=None):
    """Set mlp.fused on every MLP (plain or gated) whose activation has a fused form, where the fused MLP passed its check on
    every rank and measured faster than the unfused MLP (its activation on the path select() chose) at this run's
    shape: the third path per activation, beside the compiler and the elementwise kernel, decided by measurement as
    they are (cached, recorded, reused on resume). Returns {"mlp/NAME": {impl: "fused" | "unfused", reason,
    triton_ms (fused), torch_ms (unfused), key, source}}; prints one line per group on a GPU."""
    if platform.device_type not in FUSED_DEVICES or selfcheck.blocker(platform) is not None:
        return {}
    groups = fused_groups(model)
    if not groups:
        return {}
    master = dist_info is None or dist_info.master
    where = f"{platform.name}, {str(dtype).replace('torch.', '')}"
    since, recorded = (time.time(), {}) if reprobe else (None, recorded or {})
    deadline = time.monotonic() + timeout
    local = {}
    for name, mlps in groups.items():
        m = mlps[0]
        key = {**decision_key(platform, dtype, shape, compiled), "d_model": m.c_fc.in_features}
        old = recorded.get(name)
        if old is not None and old.get("key") == key:
            ms = {"triton": old["triton_ms"], "torch": old["torch_ms"]} if old.get("triton_ms") is not None else None
            local[name] = (None if ms else old["reason"]), ms, "recorded", key
            continue
        state = {"act": {k: v.tolist() for k, v in m.act.state_dict().items()}, "d_model": m.c_fc.in_features,
                 "impl": getattr(m.act, "impl", None)}
        v = verdict(name, (name, state, tuple(shape), str(device), dtype, compiled), key, cache_dir(cache), since,
                    deadline, work or selfcheck.probe_fused)
        ms = {"triton": v["triton_ms"], "torch": v["torch_ms"]} if v["ok"] else None
        reason = None if v["ok"] else f"the fused MLP failed its check on {where}: {v['reason']}"
        local[name] = reason, ms, (f"cached {v['date']}" if v["cached"] else "probed"), key
    world = dist_info.world_size if dist_info is not None else 1
    decisions = {}
    for name, (failed, fused_ms, unfused_ms) in zip(groups, _vote(local, list(groups), dist_info)):
        reason, _, source, key = local[name]
        record = {"impl": "unfused", "reason": reason, "triton_ms": None, "torch_ms": None, "key": key,
                  "source": source}
        if failed == 0:
            f, u = fused_ms / world, unfused_ms / world
            record.update(impl="fused" if f < u else "unfused", triton_ms=f, torch_ms=u,
                          reason=f"fused {f:.3f} ms vs unfused {u:.3f} ms, {'compiled' if compiled else 'eager'} "
                                 f"MLP fwd+bwd at {shape[0]}x{key['d_model']}x{shape[1]} on {where}")
        elif reason is None:
            record["reason"] = f"the fused MLP failed on {int(failed)} other rank(s) (their lines say why)"
        for m in groups[name]:
            m.fused = record["impl"] == "fused"
        decisions[name] = record
        if master:
            how = SOURCES.get(source, f"verdict {source}; --kernel-reprobe probes again")
            print(f"{name}: {record['impl']} MLP ({record['reason']}{'; ' + how if how else ''})", flush=True)
    return decisions
