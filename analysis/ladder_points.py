"""A ladder's runs as points: each finished run's arm, size, lr, seed, final val loss and compute, read from its own
run.json and metrics.jsonl (never from directory names, so runs made by hand or on other machines read alike). The
arm is analysis/arms.py's (the rule the sweep report uses too); the size is (n_layer, n_embd, n_head), the lr
run.json's `lr` (what the sweep set), the seed run.seed, the loss the final val loss of a finished run and the
compute the `flops` of its last eval record (model.py's flops_per_token times the tokens); `metrics` the in-loop
metrics it logged at its final evaluation (the step of its final val loss) and `declared` how run.json declares them
(training/in_loop.py's Metric), for analysis/ladder_downstream.py."""
import json
from pathlib import Path

from analysis.arms import SHAPE, arms_of
from analysis.runs import RunError, finished, load_run, read_metrics, summary

def run_dirs(out):
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and
                  ((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file()))


def plan_of(out):
    """The sweep's sweep_plan.json, {} without one (runs made by hand)."""
    path = Path(out) / "sweep_plan.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_points(out):
    """([{arm, size, lr, seed, loss, compute, path}] of the finished runs with a run.json, [unfinished paths])."""
    points, unfinished, runs = [], [], []
    for path in run_dirs(out):
        run = load_run(path)
        if run.config is None:
            continue
        if not finished(path):
            unfinished.append(path.name)
            continue
        model = run.config.get("model", {})
        flops = [r["flops"] for r in read_metrics(path / "metrics.jsonl") if r.get("kind") == "eval" and "flops" in r] \
            if (path / "metrics.jsonl").is_file() else []
        runs.append(run)
        points.append({"size": tuple(model.get(k) for k in SHAPE), "lr": run.lr, "seed": run.setting("seed"),
                       "loss": summary(run)["final_val"], "compute": flops[-1] if flops else None, "path": path.name,
                       "vocab": model.get("vocab_size"), "metrics": final_metrics(run), "declared": run.metrics})
    for point, arm in zip(points, arms_of(runs, plan_of(out).get("variants") or {})):
        point["arm"] = arm
    return points, unfinished


def final_metrics(run):
    """{name: value} of the in-loop metrics a run logged at its final evaluation (its last val loss's step)."""
    val = run.series.get("val")
    if not val:
        return {}
    return {name: series[-1][1] for name in run.metrics
            if (series := run.series.get(name)) and series[-1][0] == val[-1][0]}


def is_ladder(out):
    """Whether a sweep directory holds a ladder plan's runs, or (no plan recorded) finished runs of several sizes or
    several lrs. A recorded plan decides: arms that differ in shape without a ladder table are a sweep's arms."""
    plan = Path(out) / "sweep_plan.json"
    if plan.is_file():
        return bool(json.loads(plan.read_text()).get("ladder"))
    try:
        points, _ = read_points(out)
    except RunError:
        return False
    return len({p["size"] for p in points}) > 1 or len({p["lr"] for p in points}) > 1


def by_size_arm_lr(points):
    """{size: {arm: {lr: {seed: point}}}}"""
    out = {}
    for p in points:
        out.setdefault(p["size"], {}).setdefault(p["arm"], {}).setdefault(p["lr"], {})[p["seed"]] = p
    return out


def shape_of(options):
    """(n_layer, n_embd, n_head) of a size's trainer options, as sweep_plan.json records them."""
    return tuple(int(options[options.index(f"--{k.replace('_', '-')}") + 1]) for k in SHAPE)
