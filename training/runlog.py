"""Run logs: the human stdout lines (their format is here, below), `log.txt` in build-nanogpt's `step kind value` format,
`metrics.jsonl` with every record, and `run.json` with the resolved config and, per start of the run (`segments`),
its environment, decisions and git revision (a dirty tree's diff in `source.diff`);
optionally the same records as TensorBoard events (`tb/`) and as a Weights & Biases run (`wandb/`)."""
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from data.files import atomic_file
from training import hardware
from training.config import ConfigError, listed_changes

ROOT = Path(__file__).resolve().parents[1]


def git_state(root=ROOT):
    """(commit, `git status` lines of uncommitted changes and untracked files) of the tree at root, or (None, why)
    when git is missing or root is no repository: one git call."""
    try:
        out = subprocess.run(["git", "status", "--porcelain=v2", "--branch"], cwd=root, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"git did not run ({e.__class__.__name__})"
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or ["git status failed"])[0]
    lines = out.stdout.splitlines()
    commit = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), "(initial)")
    return (None if commit == "(initial)" else commit), [line for line in lines if not line.startswith("#")]


def git_revision():
    """The commit, with +dirty when the tree has changes; None outside a repository."""
    commit, changes = git_state()
    return commit and commit + ("+dirty" if changes else "")


def record_source(out_dir, start_step, root=ROOT):
    """The code a run segment runs: {"commit", "dirty"}, and for a dirty tree the diff against the commit (plus the
    untracked files' names) written into out_dir (source.diff; a resume at step N: source_N.diff) with its sha256,
    as modded-nanogpt's logs carry their source. Without git or a repository it says why; the run goes on."""
    commit, changes = git_state(root)
    if commit is None:
        return {"commit": None, "why": changes if isinstance(changes, str) else "a repository without commits"}
    if not changes:
        return {"commit": commit, "dirty": False}
    try:
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=root, capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        diff = f"(git diff did not run: {e.__class__.__name__})\n"
    untracked = [line[2:] for line in changes if line.startswith("? ")]
    text = "".join(f"# untracked: {name}\n" for name in untracked) + diff  # git apply skips lines before a diff
    name = "source.diff" if start_step == 0 else f"source_{start_step:05d}.diff"
    with atomic_file(Path(out_dir) / name, "w") as f:
        f.write(text)
    return {"commit": commit, "dirty": True, "diff": name, "diff_sha256": hashlib.sha256(text.encode()).hexdigest()}


def environment(dist_info):
    """What can change a result besides the config: versions, world size, device (the trainer adds its decisions,
    gradient accumulation and the source)."""
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "triton": hardware.triton_version(imports=False),
           "cuda": torch.version.cuda, "platform": platform.platform(), "hostname": platform.node(),
           "argv": sys.argv, "world_size": dist_info.world_size, "device": dist_info.device,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if dist_info.device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
    return env


def recorded_kernels(run_dir):
    """The activation kernel decisions written in a run directory's run.json (what --kernels-from reuses)."""
    path = Path(run_dir)
    path = path / "run.json" if path.is_dir() else path
    try:
        decisions = json.loads(path.read_text())["environment"]["decisions"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"--kernels-from {run_dir}: no run.json with kernel decisions there; name the directory "
                          "of a run that has started (its run.json)") from None
    return decisions.get("activations") or {}


def previous_segments(path):
    """The segments of an existing run.json (analysis/runs.py reads them too); one written before segments existed
    gives its single environment as a start at a step it does not say (None)."""
    try:
        info = json.loads(Path(path).read_text())
        return info["segments"] if "segments" in info else [{"start_step": None, "environment": info["environment"]}]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def _truncate_after(path, keep):
    """Drop lines written after the checkpoint being resumed, so a resumed log has no duplicates."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if keep(line)]
    if len(kept) != len(lines):
        with atomic_file(path, "w") as f:
            f.write("".join(kept))


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


def start_wandb(out_dir, project, name, resuming):
    """A wandb run writing under OUT_DIR/wandb. A resumed training run continues its wandb run (the id is kept
    in OUT_DIR/wandb_run_id); a fresh one starts a new run."""
    try:
        import wandb
    except ImportError:
        raise SystemExit("--wandb-project needs the wandb package: pip install wandb") from None
    id_file = out_dir / "wandb_run_id"
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None  # None: wandb makes one
    try:
        run = wandb.init(project=project, name=name or out_dir.resolve().name, id=run_id, resume="allow",
                         dir=out_dir)
    except wandb.errors.Error as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SystemExit(f"--wandb-project: wandb could not start a run ({first_line}); run `wandb login`, or set "
                         f"WANDB_MODE=offline and `wandb sync {out_dir}/wandb/offline-run-*` later") from None
    id_file.write_text(run.id + "\n")
    # Our step is the x axis, not wandb's own _step: a resumed run logs again the steps between its checkpoint
    # and the crash, which wandb drops (with a warning each) when they are given as its step.
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


class RunLog:
    """Only the master rank writes; other ranks get a RunLog that does nothing."""

    def __init__(self, out_dir, master=True, resume_step=None, tensorboard=False, wandb_project=None,
                 wandb_run_name=None):
        self.dir = Path(out_dir)
        self.master = master
        self.tb = self.wandb = None
        self.finished = False
        self.resume_step = resume_step
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
        if wandb_project:
            self.wandb = start_wandb(self.dir, wandb_project, wandb_run_name, resuming=resume_step is not None)

    def write_run_info(self, config, env, lr=None, metrics=None):
        """run.json: the config, the run's learning rate `lr` (the one a sweep sets, whatever the trainer calls
        it: training.config.learning_rate), the in-loop metrics (training/in_loop.py's Metric records: what the
        readers show; a run.json without them is read as the project's earlier trainers wrote it), this start's
        environment, and `segments`: the environment of every start whose steps the logs keep (a resume at step N
        drops those from N on, as the logs do), so that a restart on other hardware or code, which may decide other
        kernels, shows. Records this start's source first."""
        if self.master:
            start = self.resume_step or 0
            env = {**env, "source": record_source(self.dir, start)}
            segments = [s for s in previous_segments(self.dir / "run.json") if self.resume_step is not None and
                        (s["start_step"] is None or s["start_step"] < start)]
            segments.append({"start_step": start, "environment": env})
            declared = {} if metrics is None else {"metrics": metrics}
            with atomic_file(self.dir / "run.json", "w") as f:
                f.write(json.dumps({"config": config, "lr": lr, **declared, "environment": env, "segments": segments},
                                   indent=2, default=str))
            if self.wandb is not None:  # a resumed run changes options such as `resume` itself
                self.wandb.config.update({**config, "environment": env}, allow_val_change=True)

    def scalar(self, step, kind, value):
        """One `step kind value` line (train, val, hella, bleu ...), as build-nanogpt writes. Not sent to wandb:
        every such number is also in a record."""
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
            if self.wandb is not None:  # train/loss, eval/val_loss, ...; telemetry/... keeps its own section
                kind = fields.get("kind", "record")
                self.wandb.log({"step": step, **{key if "/" in key else f"{kind}/{key}": value
                                                 for key, value in _scalars(fields)}})

    def summary(self, **fields):
        """The finished run's outcome (the trainer's closing line in numbers): wandb's run summary."""
        self.finished = True
        if self.wandb is not None:
            self.wandb.summary.update(fields)

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:  # a crash or a signal leaves the run unfinished: failed, as its exit status says
            self.wandb.finish(exit_code=0 if self.finished else 1)


# The stdout lines of a training run, in the order they appear ------------------------------------------------
def restart_line(restart, checkpoint, step):
    """torchrun --max-restarts started this attempt after a failure."""
    where = f"resuming {Path(checkpoint).name} at step {step}" if checkpoint else "starting from scratch (no checkpoint yet)"
    return f"restart {restart}: {where}"


def start_line(description, max_steps, world_size, precision, compiled, where):
    return f"{description} | {max_steps} steps | world {world_size} | {precision} | compile {compiled} | {where}"


def changes_line(step, changes):
    """A resume that changes options on purpose (--resume-changes): which, from what to what."""
    return f"changed from step {step} on (--resume-changes): {listed_changes(changes)}"


def eval_line(step, max_steps, text):
    return f"step {step:5d}/{max_steps} | {text}"


def step_line(step, max_steps, loss, lr, norm, seconds, token_unit, tok_per_s, extra, eta):
    """One optimizer step: its loss, lr, gradient norm, time, throughput, the trainer's extra fields (MFU as a
    percentage) and the time left."""
    extra_text = "".join(f" | {k} {v:.1%}" if k == "mfu" else f" | {k} {v}" for k, v in extra.items() if v is not None)
    return (f"step {step:5d}/{max_steps} | loss {loss:.4f} | lr {lr:.3e} | norm {norm:.3f} | dt {1000 * seconds:.0f}ms | "
            f"{token_unit}/s {tok_per_s:,.0f}{extra_text} | eta {clock(eta)}")


def summary_line(start_step, step, seconds, final_val, best_val, out_dir, checkpoint):
    """The closing line: what ran, how long, the final validation and the run's best (val loss, step) where it is
    another, where the files are."""
    best = f" (best {best_val[0]:.4f} at step {best_val[1]})" if best_val and best_val[1] != step else ""
    final = "-" if final_val is None else f"{final_val:.4f}"
    return (f"done: steps {start_step}-{step} in {clock(seconds)} | final val loss {final}{best} | "
            f"{out_dir}/: log.txt, metrics.jsonl, run.json" + (f", {Path(checkpoint).name}" if checkpoint else ""))


def clock(seconds):
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
