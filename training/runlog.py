"""Run logs: a human stdout line, `log.txt` in build-nanogpt's `step kind value` format,
`metrics.jsonl` with every record, and `run.json` with the resolved config, environment and git revision."""
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch


def git_revision():
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None


def environment(dist_info):
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
           "hostname": platform.node(), "argv": sys.argv, "world_size": dist_info.world_size,
           "device": dist_info.device, "git": git_revision(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if dist_info.device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def _truncate_after(path, keep):
    """Drop lines written after the checkpoint being resumed, so a resumed log has no duplicates."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if keep(line)]
    if len(kept) != len(lines):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def _step_of_text(line):
    try:
        return int(line.split()[0])
    except (ValueError, IndexError):
        return -1


def _step_of_json(line):
    try:
        return int(json.loads(line).get("step", -1))
    except (ValueError, AttributeError):
        return -1


def _scalars(fields, prefix=""):
    """(tag, number) of every number in nested dicts/lists, e.g. telemetry/layers/0/params/kappa."""
    items = fields.items() if isinstance(fields, dict) else enumerate(fields)
    for key, value in items:
        if isinstance(value, (dict, list)):
            yield from _scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


class RunLog:
    """Only the master rank writes; other ranks get a RunLog that does nothing."""

    def __init__(self, out_dir, master=True, resume_step=None, tensorboard=False):
        self.dir = Path(out_dir)
        self.master = master
        self.tb = None
        if not master:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.text_path, self.jsonl_path = self.dir / "log.txt", self.dir / "metrics.jsonl"
        if resume_step is None:
            for p in (self.text_path, self.jsonl_path):
                p.unlink(missing_ok=True)
        else:
            _truncate_after(self.text_path, lambda line: _step_of_text(line) < resume_step)
            _truncate_after(self.jsonl_path, lambda line: _step_of_json(line) < resume_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise SystemExit("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self.tb = SummaryWriter(self.dir / "tb")

    def write_run_info(self, config, env):
        if self.master:
            tmp = self.dir / "run.json.tmp"
            tmp.write_text(json.dumps({"config": config, "environment": env}, indent=2, default=str))
            os.replace(tmp, self.dir / "run.json")

    def scalar(self, step, kind, value):
        """One `step kind value` line (train, val, hella, bleu ...), as build-nanogpt writes."""
        if self.master:
            with open(self.text_path, "a") as f:
                f.write(f"{step} {kind} {value:.6f}\n")
            if self.tb is not None:
                self.tb.add_scalar(kind, value, step)

    def record(self, step, **fields):
        if self.master:
            with open(self.jsonl_path, "a") as f:
                f.write(json.dumps({"step": step, "time": round(time.time(), 3), **fields}, default=float) + "\n")
            if self.tb is not None:
                for key, value in _scalars(fields):
                    self.tb.add_scalar(key, value, step)

    def close(self):
        if self.tb is not None:
            self.tb.close()
