"""A ladder's runs as points: each finished run's arm, size, lr, seed, final val loss and compute, read from its own
run.json and metrics.jsonl (never from directory names, so runs made by hand or on other machines read alike). The
arm is the plan's variant whose options the run's config holds (the most specific one: gelu_cp's act gelu and param
completep over gelu_sp's act gelu), else the model options besides the shape (an option that differs between runs
is named in the label, e.g. gelu+norm=rmsnorm) and the init seed offset; the size is (n_layer, n_embd, n_head), the
lr run.json's `lr` (what the sweep set), the seed run.seed, the loss the final val loss of a finished run and the
compute the `flops` of its last eval record (model.py's flops_per_token times the tokens)."""
import json
from pathlib import Path

from analysis.runs import RunError, finished, load_run, read_metrics, summary

SHAPE = ("n_layer", "n_embd", "n_head")
NOT_ARM = (*SHAPE, "block_size", "vocab_size")  # the model options that are the size's or the data's, not the arm's



def _text(value):
    """An option's value in an arm label: rmsnorm, 1000000, {"impl":"torch"}."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def run_dirs(out):
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and
                  ((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file()))


def plan_of(out):
    """The sweep's sweep_plan.json, {} without one (runs made by hand)."""
    path = Path(out) / "sweep_plan.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _option_text(value):
    """A config value as a plan's trainer option writes it (sweep/plan.py's options)."""
    return json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)


def variant_of(run, variants):
    """The label of the plan's most specific variant (the most options) whose every option the run's config holds;
    None when none does, or two equally specific do."""
    matches = sorted((len(opts), label) for label, opts in variants.items()
                     if all(run.setting(flag[2:].replace("-", "_")) is not None
                            and _option_text(run.setting(flag[2:].replace("-", "_"))) == value
                            for flag, value in zip(opts[::2], opts[1::2])))
    if not matches or (len(matches) > 1 and matches[-1][0] == matches[-2][0]):
        return None
    return matches[-1][1]


def read_points(out):
    """([{arm, size, lr, seed, loss, compute, path}] of the finished runs with a run.json, [unfinished paths])."""
    points, unfinished, identities = [], [], []
    variants = plan_of(out).get("variants") or {}
    for path in run_dirs(out):
        run = load_run(path)
        if run.config is None:
            continue
        if not finished(path):
            unfinished.append(path.name)
            continue
        model = run.config.get("model", {})
        identity = {k: v for k, v in model.items() if k not in NOT_ARM}
        if offset := run.setting("init_seed_offset"):  # an A/A control: the baseline's options, another init
            identity["init_seed_offset"] = offset
        flops = [r["flops"] for r in read_metrics(path / "metrics.jsonl") if r.get("kind") == "eval" and "flops" in r] \
            if (path / "metrics.jsonl").is_file() else []
        identities.append(identity)
        points.append({"variant": variant_of(run, variants), "size": tuple(model.get(k) for k in SHAPE), "lr": run.lr,
                       "seed": run.setting("seed"), "loss": summary(run)["final_val"],
                       "compute": flops[-1] if flops else None, "path": path.name, "vocab": model.get("vocab_size")})
    varying = [k for k in dict.fromkeys(k for i in identities for k in i)
               if k != "act" and len({json.dumps(i.get(k), sort_keys=True) for i in identities}) > 1]
    for point, identity in zip(points, identities):
        point["arm"] = point.pop("variant") or str(identity.get("act")) + "".join(
            f"+{k}={_text(identity[k])}" for k in varying if k in identity)
    return points, unfinished


def is_ladder(out):
    """Whether a sweep directory holds a ladder plan's runs, or finished runs of several sizes or several lrs."""
    plan = Path(out) / "sweep_plan.json"
    if plan.is_file() and json.loads(plan.read_text()).get("ladder"):
        return True
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
