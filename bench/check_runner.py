"""bench/gpu_check.py's runner: each check is a section with a wall-clock bound, run in this process or (on a GPU) in
a child process of its own, stopped with every process it started once its bound is spent; its result PASS / FAIL
(or SKIP with the reason) with its figures, printed as one line and kept for the markdown table.

A check is `check(ctx) -> (ok, figures)` that may raise Skip; `ctx` carries `bound` (seconds) and `deadline` (its
end, seconds since the epoch), set here, and `out`, where a child section writes its result for the parent."""
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CHILD_MARGIN = 5  # a section's child stops its own processes this many seconds before its bound


class Skip(Exception):
    pass


class OverBound(Exception):
    pass


def left(ctx):
    """Seconds left of the running section's bound; OverBound once it is spent."""
    seconds = ctx.deadline - time.time()
    if seconds <= 0:
        raise OverBound(f"the section's {ctx.bound} s bound was spent before it finished")
    return seconds


def run(ctx, cmd, env=None):
    """A child process of this repository (its own torch, as a user runs it), killed with every process it started
    (torchrun's workers, a probe) when the section's bound is spent; its output kept for the report."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    release()
    timeout = left(ctx)
    with subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except BaseException as e:  # the bound, or Ctrl-C: a new session gets no terminal signal, so stop it here
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            if isinstance(e, subprocess.TimeoutExpired):
                raise OverBound(f"{' '.join(map(str, cmd[1:3]))} did not finish within the section's {ctx.bound} s "
                                "bound; stopped") from None
            raise
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[1:3]))} exited {child.returncode}: "
                           f"{(stderr or stdout).strip()[-1500:]}")
    return stdout


def release():
    """This process's cached CUDA memory back to the driver: a child (train_step's contenders, a trainer) can
    use only what no other process keeps, and the caching allocator keeps what this one's sections freed."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def section(check, ctx):
    """Run one section in this process: {"status", "figures"} or {"status", "reason"}."""
    try:
        ok, figures = check(ctx)
        return {"status": "PASS" if ok else "FAIL", "figures": figures}
    except Skip as e:
        return {"status": "SKIP", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - one broken check must not hide the others' figures
        return {"status": "FAIL", "reason": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}


def section_in_child(script, name, ctx, flags):
    """On a GPU every section runs in a process of its own (`script --section=NAME`): stopped at its bound even
    inside a compile, and the GPU memory it used (the caching allocator's blocks, compiled graphs, CUDA graph pools)
    is the driver's again once it exits, so each section finds the GPU as the first one did (the parent holds its
    CUDA context only)."""
    try:
        run(ctx, [sys.executable, script, f"--section={name}", "--deadline", ctx.deadline, *flags])
    except (OverBound, RuntimeError) as e:
        return {"status": "FAIL", "reason": str(e)}
    return json.loads((ctx.out / f"section_{name}.json").read_text())


def section_child(name, check, ctx, bound, deadline):
    """The child's side: the section, its own processes stopped a few seconds before the parent stops it, so
    that it reports which one ran over; the result in OUT/section_NAME.json."""
    ctx.bound = bound
    ctx.deadline = (deadline or time.time() + ctx.bound) - CHILD_MARGIN  # by hand, without a parent: its bound
    with tempfile.TemporaryDirectory(prefix=f"gpu_check_{name}_") as tmp:
        ctx.tmp = Path(tmp)
        result = section(check, ctx)
    (ctx.out / f"section_{name}.json").write_text(json.dumps(result, default=str) + "\n")
    return 0


def bounded_section(name, check, ctx, bound, child=None):
    """One section under its bound, in this process or, given `child` ((script, flags)), in a child process; the
    result with its seconds, and its line printed."""
    t0 = time.time()
    ctx.bound, ctx.deadline = bound, t0 + bound
    if child:
        script, flags = child
        result = section_in_child(script, name, ctx, flags)
    else:
        result = section(check, ctx)
    result["seconds"] = round(time.time() - t0, 1)
    result["bound_seconds"] = bound
    print(f"{name:12s} {result['status']:5s} {result['seconds']:7.1f}s  "
          f"{result.get('reason') or '; '.join(flat(result['figures']))[:600]}", flush=True)
    return result


def skipped(name, reason, short):
    """A section not run here: SKIP with the reason, its line printed with the short one."""
    print(f"{name:12s} SKIP  {short}", flush=True)
    return {"status": "SKIP", "reason": reason}


def flat(fig, prefix=""):
    """'key value' pairs of nested figures, for the markdown table."""
    items = []
    for k, v in fig.items():
        if isinstance(v, dict):
            items += flat(v, f"{prefix}{k}.")
        elif isinstance(v, float):
            items.append(f"{prefix}{k} {v:.4g}")
        elif isinstance(v, list):
            items.append(f"{prefix}{k} " + "; ".join(map(str, v)))
        else:
            items.append(f"{prefix}{k} {v}")
    return items


def table(results):
    """The markdown table of the sections' results, one row each."""
    lines = ["| check | result | seconds | figures |", "|---|---|---|---|"]
    for name, r in results.items():
        figures = r.get("reason") or "<br>".join(flat(r.get("figures", {})))
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', '')} | {figures.replace('|', '/')} |")
    return lines
