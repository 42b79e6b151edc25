"""Train one config over several activations and seeds, then compare them with paired statistics.

    python -m analysis.sweep --config configs/gpt2_cpu_tiny.toml --acts gelu,aglu,nswish --seeds 1,2,3 \\
        --out-dir runs/sweep --max-steps 300            # any further --key value goes to the trainer
    python -m analysis.sweep ... --nproc-per-node 8          # each run under torchrun
    python -m analysis.sweep --plan configs/sweep_translation_acts.toml --out-dir runs/translation_acts
    python -m analysis.sweep --config configs/gpt2_cpu_tiny.toml --acts gelu,swiglu,aglu,aglu_glu --seeds 1,2,3 \
        --out-dir runs/glu                                # gated MLPs (swiglu, NAME_glu) beside plain ones
    python -m analysis.sweep --report-only runs/sweep        # re-read the runs, rewrite the report(s)
    python -m analysis.sweep --report-only runs/sweep --target-diff 0.01   # seeds to detect 0.01 nats
    python -m analysis.sweep ... --control                   # with an A/A control, reported first
    python -m analysis.sweep --plan configs/ladder_cpu.toml --out-dir runs/ladder_cpu   # sizes x lrs: a ladder
    python -m analysis.sweep --report-only runs/ladder_cpu --throughput FILE       # + wall-clock multiplier
    python -m analysis.sweep --plan configs/ladder_gpu.toml --out-dir runs/ladder_gpu --nproc-per-node 8 \
        --launcher slurm [--dry-run]                      # SLURM jobs (docs/cluster.md); --dry-run: cost, runs, stop
    python -m analysis.sweep --status runs/ladder_gpu     # every run: state, job, requeues, last logged step
    python -m analysis.sweep --report-only runs/ladder_cpu --target 1e13 --level 0.9 --resamples 2000

--trainer gpt2 (train_gpt2.py, the default) or translation (train_translation.py). A --plan TOML file names
the trainer, config and seeds, the variants (a label each, with its trainer options such as act,
act_kwargs, plain_top_k, and the label it is compared against as `baseline`) and optionally corpora
(a name each, with trainer options such as train_prefix): each corpus is a sweep of its own in
OUT_DIR/{corpus}. Before anything runs, the sweep prints its cost (analysis/cost.py: FLOPs per run, per size and
in all; GPU-hours with --throughput or finished runs). Runs go one after another, seed by seed (every variant's
seed 1, then seed 2 ...), each a subprocess writing to OUT_DIR[/{corpus}]/{label}_seed{seed} (its output in
train.out); --launcher local or slurm (or the plan's [launcher] table) runs them side by side or as SLURM jobs
instead (analysis/launchers.py). A variant's later seeds
run the activation kernels' path its first seed decided (the trainer's --kernels-from), or the one its options
pin (act_kwargs {"impl": ...}); the report names each variant's path. A run whose final
evaluation (translation: its test-set BLEU) is logged is skipped; an unfinished one continues from its newest
checkpoint (--auto-resume), so rerunning the same command after a crash finishes the sweep.

A ladder (analysis/ladder_plan.py): `lrs = [...]` (or --lrs) and [sizes.NAME] tables in a plan run every arm at
every lr and size, each run in OUT_DIR/{label}_{size}_lr{lr}_seed{seed}; its report is analysis/ladder_report.py's
(each arm's lr and how it was chosen, compute multiplier fitted and curve-free, trend, the interval's measured
coverage, every verdict under Holm), read from the runs' run.json, whatever their directories' names. Its
options: --target (none by default: no extrapolation unless --extrapolate), --level, --resamples, --resample-seed.

--control (or `control = true` / `control = "LABEL"` in a plan) adds an A/A control: the baseline again as
BASELINE_aa with the same seeds, hence the same data order, but torch's RNG (init, dropout) seeded with
seed + 1,000,000 (the trainer's --init-seed-offset). Its difference to the baseline is noise by construction.

The report (analysis/sweep_report.py: stdout, sweep.md, sweep.json, compare.png, compare_telemetry.png in each
sweep directory) has mean ± sample std per variant of the final val loss (and HellaSwag acc_norm / valid and
test BLEU where logged), and for each variant the paired difference to its baseline (--acts: the first, or
--baseline) over the seeds both finished: mean, std, t = mean / (std/sqrt n), the 95% interval
mean ± t_{0.975, n-1} std/sqrt(n), the difference those seeds detect with 80% power and the seeds
--target-diff (default: the observed difference) needs; and each variant's parameter count, flagged where it
differs from its baseline's by more than 0.5%, and every setting besides the config (precision, compile, world
size x grad accum, versions, code) that differs between any runs or changed within one (analysis/run_setup.py).
Each pair and metric also gets the paired t-test's p and its Holm adjustment over the sweep's claims: the report
declares a difference at family-wise error rate 0.05 (the A/A control likewise over its own metrics). Negative
val-loss differences favour the variant.
HellaSwag pairs also get the item-level interval of their difference, from the runs' final items files
(train with --hellaswag-interval): another sample of items, beside the seeds' another seed of training.
"""
import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tqdm import tqdm

import activations
from analysis import ladder_plan, launchers, sweep_status
from analysis.cost import bench_rates, cost_text, run_rates
from analysis.ladder_report import is_ladder, ladder_report
from analysis.sweep_report import finished, report
from errors import ConfigError

TRAINERS = {"gpt2": ROOT / "train_gpt2.py", "translation": ROOT / "train_translation.py"}
RESERVED = {"--act", "--seed", "--out-dir", "--out_dir", "--resume", "--auto-resume", "--auto_resume", "--config",
            "--init-seed-offset", "--init_seed_offset", "--kernels-from", "--kernels_from"}
# The A/A control's torch seed is seed + this: far from any seed list, so no control run shares an init stream
# with a baseline run, while the data order (the seed alone) stays the baseline's.
CONTROL_INIT_SEED_OFFSET = 1_000_000
LABEL = re.compile(r"[A-Za-z0-9.+-][A-Za-z0-9_.+-]*")


def run_dir(out_dir, label, seed, size=None, lr=None):
    return Path(out_dir) / "_".join([label, *([size] if size else []), *([f"lr{lr:g}"] if lr else []), f"seed{seed}"])


def options(table):
    """Trainer command-line options from a TOML table: {"plain_top_k": 1} -> ["--plain-top-k", "1"]."""
    out = []
    for key, value in table.items():
        text = json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
        out += [f"--{key.replace('_', '-')}", text]
    return out


def train_argv(trainer, config, variant_options, seed, path, overrides):
    """The trainer script and its options for one run (a launcher puts python or torchrun before it)."""
    return [str(TRAINERS[trainer]), "--config", config, *variant_options, "--seed", str(seed),
            "--out-dir", str(path), "--auto-resume", *overrides]


def run_sweep(args, overrides, out, corpus_options=()):
    """The runs of one sweep directory: every variant x seed, with the corpus options (if any) before overrides.
    Returns the runs still queued on a scheduler (none for the sequential and local launchers)."""
    overrides = [*corpus_options, *overrides]
    ladder = args.ladder
    if ladder is None:  # seed by seed: a sweep stopped early still pairs every variant with its baseline
        jobs = [(label, opts, seed, None, None) for seed in args.seeds for label, opts, _ in args.variants]
        phases = [jobs]
    else:
        grid_sizes = [ladder.lr_size] if ladder.lr_size else list(ladder.sizes)
        lrs = {label: ladder.lrs for label, _, _ in args.variants}
        rest = [size for size in ladder.sizes if size not in grid_sizes or ladder.lr_seeds]
        # the other sizes (with lr_seeds, every size) run at each arm's best lr of the whole grid, known once every
        # grid run finished; their FLOPs do not depend on it
        phases = [ladder_jobs(args, grid_sizes, lrs, grid_seeds(args)),
                  ladder_jobs(args, rest, {label: [None] for label in lrs})]
    sizes = list(ladder.sizes) if ladder else [None]
    runs = sorted(((size, [*opts, *overrides]) for phase in phases for _, opts, _, size, _ in phase),
                  key=lambda run: sizes.index(run[0]))  # the plan's order of sizes
    print(cost_text(args.trainer, args.config, runs, *throughput(args, out)))
    if args.dry_run:
        for label, opts, seed, size, lr in phases[0]:
            path = run_dir(out, label, seed, size, lr)
            print(f"{path}: {' '.join(train_argv(args.trainer, args.config, opts, seed, path, overrides))}")
        for label, _, seed, size, _ in [job for phase in phases[1:] for job in phase]:
            print(f"{label} size {size} seed {seed}: after the lr grid, at {label}'s best lr")
        return []
    write_plan(args, overrides, out)
    queued = launch(args, overrides, out, phases[0])
    if ladder is None or not phases[1] or queued:
        return queued
    try:
        best = {label: ladder_plan.best_lr(label, {lr: {seed: run_dir(out, label, seed, ladder.lr_size, lr)
                                                        for seed in grid_seeds(args)} for lr in ladder.lrs})
                for label, _, _ in args.variants}
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    tqdm.write(f"best lr at size {ladder.lr_size}: " + ", ".join(f"{a} {lr:g}" for a, lr in best.items()))
    return launch(args, overrides, out, ladder_jobs(args, rest, {label: [lr] for label, lr in best.items()}))


def throughput(args, out):
    """({act: FLOP/s per GPU}, its source) for the cost line: --throughput files, else this sweep's finished runs."""
    if args.throughput:
        return bench_rates(args.throughput)
    return run_rates([out] if out.is_dir() else [])


def write_plan(args, overrides, out):
    """OUT/sweep_plan.json: what the sweep runs, so that the same directory never mixes two sweeps' runs."""
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "sweep_plan.json"
    ladder = args.ladder
    plan = {"trainer": args.trainer, "config": args.config, "overrides": overrides,
            "nproc_per_node": args.nproc_per_node, "variants": {label: opts for label, opts, _ in args.variants},
            "ladder": ladder and {"sizes": args.size_options, "lrs": ladder.lrs, "lr_size": ladder.lr_size,
                                  **({"lr_seeds": ladder.lr_seeds} if ladder.lr_seeds else {})}}
    kept = ("trainer", "config", "overrides", "nproc_per_node", "ladder")
    if plan_path.exists():  # the same variant in the same directory must mean the same run
        old = {"trainer": "gpt2", **json.loads(plan_path.read_text())}
        old_variants = old.get("variants") or {a: ["--act", a] for a in old.get("acts", [])}
        if ({k: old.get(k) for k in kept} != {k: plan[k] for k in kept}
                or any(old_variants.get(label, opts) != opts for label, opts in plan["variants"].items())):
            raise SystemExit(f"error: {out} holds a sweep with other settings ({old['config']} {' '.join(old['overrides'])}); "
                             "use another --out-dir so finished runs are not mixed")
    plan_path.write_text(json.dumps({**plan, "acts": [label for label, _, _ in args.variants], "seeds": args.seeds,
                                     "baseline": args.baseline, "control": args.control or None,
                                     "baselines": {label: base for label, _, base in args.variants},
                                     "runs": sweep_status.planned_runs(args, out)}, indent=2))


def grid_seeds(args):
    """The lr grid's seeds: the plan's lr_seeds (the lr is then chosen on other seeds than it is compared on), else
    the sweep's."""
    return args.ladder.lr_seeds or args.seeds


def ladder_jobs(args, sizes, lrs, seeds=None):
    """(label, options, seed, size, lr) of each run, seed by seed (seeds: the sweep's by default), then size by size:
    a ladder stopped early still has every arm and size on its first seeds."""
    return [(label, [*opts, *args.size_options[size], *ladder_plan.lr_options(args.trainer, lr, args.lr_ratio)],
             seed, size, lr)
            for seed in seeds or args.seeds for size in sizes for label, opts, _ in args.variants for lr in lrs[label]]


def launch(args, overrides, out, jobs):
    """Hands the jobs not finished yet to the launcher; returns those it left queued on a scheduler."""
    runs = []
    for label, opts, seed, size, lr in jobs:
        path = run_dir(out, label, seed, size, lr)
        if finished(path):
            tqdm.write(f"{path}: finished, skipped")
            continue
        path.mkdir(parents=True, exist_ok=True)
        # every seed of an arm on the numerical path its first seed's run decided (activations/policy.py), where
        # that run has started when this one starts (side by side, each may decide: the report names the paths)
        first = run_dir(out, label, args.seeds[0], size, lr) if seed != args.seeds[0] else None
        cell = (f" size {size}" if size else "") + (f" lr {lr:g}" if lr else "")
        runs.append(launchers.Run(path, train_argv(args.trainer, args.config, opts, seed, path, overrides),
                                  f"{label}{cell} seed {seed}", first))
    if not runs:
        return []
    launcher = launchers.LAUNCHERS[args.resources.kind](args.resources, args.nproc_per_node, out / "submitit")
    return launcher.launch(runs)


def seed_list(text):
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,3, got {text!r}") from None


def lr_list(text):
    try:
        return [float(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 1e-3,2e-3,4e-3, got {text!r}") \
            from None


def read_plan(path, lrs=None):
    """(trainer, config, seeds, [(label, options, baseline)], [(corpus, options)], control, ladder) from a --plan
    TOML file; control is false, true or the A/A control's label; ladder: analysis/ladder_plan.py's (lrs: --lrs,
    which replaces the plan's), or None."""
    try:
        plan = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read --plan {path}: {e}") from None
    unknown = set(plan) - {"trainer", "config", "seeds", "control", "variants", "corpora", "launcher",
                           *ladder_plan.KEYS}
    if unknown or not isinstance(plan.get("variants"), dict) or not plan["variants"]:
        raise ConfigError(f"--plan {path}: expected keys trainer, config, seeds, optional control, [variants.LABEL] "
                          f"tables and optional [corpora.NAME] tables{f'; unknown {sorted(unknown)}' if unknown else ''}")
    variants = []
    for label, table in plan["variants"].items():
        table = dict(table)
        baseline = table.pop("baseline", None)
        if baseline is not None and baseline not in plan["variants"]:
            raise ConfigError(f"--plan {path}: variant {label} has baseline {baseline!r}, which is not a variant")
        variants.append((label, options(table), baseline))
    corpora = [(name, options(table)) for name, table in plan.get("corpora", {}).items()]
    control = plan.get("control", False)
    if not isinstance(control, (bool, str)):
        raise ConfigError(f"--plan {path}: control must be true or the control's label, got {control!r}")
    ladder = ladder_plan.read(plan, f"--plan {path}", lrs)
    return plan.get("trainer"), plan.get("config"), plan.get("seeds"), variants, corpora, control, ladder


def sweep_dirs(out):
    """out itself when it holds runs, else its sub-directories that hold a sweep (one per corpus)."""
    out = Path(out)
    if any((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file() for p in out.iterdir() if p.is_dir()):
        return [out]
    return sorted(p for p in out.iterdir() if (p / "sweep_plan.json").is_file()) or [out]


def parse_args(argv):
    # no abbreviations: a trainer option such as --act must not be taken for --acts
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--config", help="trainer TOML config (e.g. configs/gpt2_cpu_tiny.toml)")
    p.add_argument("--trainer", choices=sorted(TRAINERS), help="train_gpt2.py (default) or train_translation.py")
    p.add_argument("--acts", type=lambda s: [a for a in s.split(",") if a], help="comma-separated activations")
    p.add_argument("--plan", help="TOML file with trainer, config, seeds, variants and corpora (instead of --acts)")
    p.add_argument("--seeds", type=seed_list, help="comma-separated seeds")
    p.add_argument("--lrs", type=lr_list, help="comma-separated learning rates, log-spaced: every arm runs every lr "
                                               "(GPT: max_lr, min_lr scaled with it; translation: lr)")
    p.add_argument("--out-dir", help="sweep directory: one sub-directory per run, plus the report")
    p.add_argument("--baseline", help="activation the others are compared against (default: first of --acts)")
    p.add_argument("--control", nargs="?", const=True, default=False, metavar="LABEL",
                   help="add an A/A control: the baseline again as LABEL (default BASELINE_aa), same seeds and data "
                        "order, another init stream; reported first")
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes per run; >1 uses torchrun")
    p.add_argument("--launcher", choices=sorted(launchers.LAUNCHERS),
                   help="where the runs execute (default: the plan's [launcher] kind, else sequential): one after "
                        "another, side by side on this machine (submitit's local executor), or SLURM jobs")
    p.add_argument("--dry-run", action="store_true", help="print the cost and the runs, then stop")
    p.add_argument("--status", metavar="DIR", help="every run of the sweep in DIR: state, job, last logged step")
    p.add_argument("--report-only", metavar="DIR", help="only read the runs in DIR and write the report")
    p.add_argument("--throughput", action="append", metavar="FILE",
                   help="a ladder's wall-clock multiplier: bench/train_step.py --json FILE of the arms at a ladder "
                        "size, timed interleaved on one machine (repeat for more sizes)")
    p.add_argument("--target", metavar="FLOPS",
                   help="a ladder's multiplier also at this compute (FLOPs on the ladder's data) or gpt2-124m-10b; "
                        "beyond 10x the largest size or on another vocabulary only with --extrapolate")
    p.add_argument("--extrapolate", action="store_true",
                   help="allow a --target the ladder cannot support, printed and drawn as an extrapolation")
    p.add_argument("--level", type=float, default=0.95,
                   help="a ladder's interval level; its verdicts hold at family-wise error rate 1 - level (Holm)")
    p.add_argument("--resamples", type=int, default=400,
                   help="simulated ladders that measure the coverage of a ladder's multiplier interval")
    p.add_argument("--resample-seed", type=int, default=0, help="the seed of those simulations")
    p.add_argument("--target-diff", type=float, metavar="NATS",
                   help="final val loss difference whose seeds the report counts (default: the observed one)")
    args, overrides = p.parse_known_args(argv)
    args.variants, args.corpora, args.ladder = [], [], None
    if args.report_only or args.status:
        if overrides:
            p.error(f"--report-only and --status only read runs; unexpected {' '.join(overrides)}")
        return args, overrides
    launcher_table = None
    if args.plan:
        if args.acts or args.baseline:
            p.error("--plan names the variants and their baselines; leave out --acts and --baseline")
        try:
            trainer, config, seeds, args.variants, args.corpora, control, args.ladder = read_plan(args.plan, args.lrs)
        except ConfigError as e:
            p.error(str(e))
        args.control = args.control or control
        launcher_table = tomllib.loads(Path(args.plan).read_text()).get("launcher")
        args.trainer, args.config, args.seeds = args.trainer or trainer, args.config or config, args.seeds or seeds
    elif args.acts:
        args.variants = [(a, ["--act", a], None) for a in args.acts]
        try:
            args.ladder = ladder_plan.read({"lrs": args.lrs}, "--lrs") if args.lrs else None
        except ConfigError as e:
            p.error(str(e))
    args.trainer = args.trainer or "gpt2"
    missing = [f"--{n.replace('_', '-')}" for n in ("config", "seeds", "out_dir") if not getattr(args, n)]
    missing = (["--acts (or --plan)"] if not args.variants else []) + missing
    if missing:
        p.error(f"missing {', '.join(missing)} (or use --report-only DIR)")
    if args.trainer not in TRAINERS:
        p.error(f"unknown trainer {args.trainer!r}; choose one of {', '.join(sorted(TRAINERS))}")
    clash = [o.split("=")[0] for o in overrides if o.split("=")[0] in RESERVED]
    clash += [o for _, opts in args.corpora for o in opts[::2] if o in RESERVED or o == "--act"]
    clash += [o for _, opts, _ in args.variants for o in opts[::2] if o in RESERVED - {"--act"}]
    if clash:
        p.error(f"{', '.join(clash)} is set by the sweep for each run; remove it from the trainer options")
    if args.ladder:
        fixed = args.ladder.fixed_options(args.trainer)
        clash = [o for o in overrides + [o for _, opts in args.corpora for o in opts[::2]] +
                 [o for _, opts, _ in args.variants for o in opts[::2]] if o.split("=")[0].replace("_", "-") in fixed]
        if clash:
            p.error(f"{', '.join(clash)} is set by the ladder (sizes, lrs) for each run; remove it from the options")
        try:
            args.size_options, args.lr_ratio = ladder_plan.check(args.ladder, args.trainer, args.config)
        except ConfigError as e:
            p.error(str(e))
    bad = [name for name, *_ in args.variants + args.corpora if not LABEL.fullmatch(name)]
    if bad:
        p.error(f"variant/corpus names {', '.join(bad)} must be letters, digits, . _ + - (they name directories)")
    acts = [opts[opts.index("--act") + 1] for _, opts, _ in args.variants if "--act" in opts]
    unknown = [a for a in acts if a not in activations.available() and activations.gate_activation(a) is None]
    if unknown:
        p.error(f"unknown activation(s) {', '.join(unknown)}; choose from {', '.join(activations.available())}, or a "
                f"gated MLP: {', '.join(activations.GLU_NAMES)} or NAME{activations.GLU_SUFFIX}")
    labels = [label for label, _, _ in args.variants]
    if args.baseline and args.baseline not in labels:
        p.error(f"--baseline {args.baseline} is not one of --acts {','.join(labels)}")
    if args.nproc_per_node < 1:
        p.error("--nproc-per-node must be at least 1")
    try:
        args.resources = launchers.read_resources(launcher_table, f"--plan {args.plan}" if args.plan else "--launcher",
                                                  args.launcher)
    except ConfigError as e:
        p.error(str(e))
    args.baseline = args.baseline or labels[0]
    if args.control:
        label = args.control if isinstance(args.control, str) else f"{args.baseline}_aa"
        if label in labels or not LABEL.fullmatch(label):
            p.error(f"control label {label!r} must be new and made of letters, digits, . _ + -")
        base_options = next(opts for name, opts, _ in args.variants if name == args.baseline)
        args.variants.insert(labels.index(args.baseline) + 1, (
            label, [*base_options, "--init-seed-offset", str(CONTROL_INIT_SEED_OFFSET)], args.baseline))
        args.control, labels = label, [name for name, _, _ in args.variants]
    args.acts = labels
    return args, overrides


def main(argv=None):
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if args.status:
        if not Path(args.status).is_dir():
            raise SystemExit(f"error: {args.status}: no such sweep directory")
        for directory in sweep_dirs(args.status):
            print(sweep_status.status_text(directory))
        return
    out = Path(args.report_only or args.out_dir)
    if not args.report_only:
        queued = []
        try:
            for corpus, corpus_options in args.corpora or [(None, [])]:
                queued += run_sweep(args, overrides, out / corpus if corpus else out, corpus_options)
        except ConfigError as e:
            raise SystemExit(f"error: {e}") from None
        if args.dry_run:
            return
        if queued:
            print(f"{len(queued)} runs queued as SLURM jobs (job.json in each run's directory). Follow them with "
                  f"`python -m analysis.sweep --status {out}`; once they end, run this command again: it skips "
                  "finished runs, leaves queued ones alone, submits what comes next (a ladder's sizes after its lr "
                  "grid) and writes the report")
            return
    if not out.is_dir():
        raise SystemExit(f"error: {out}: no such sweep directory")
    for directory in sweep_dirs(out):
        if is_ladder(directory):
            print(ladder_report(directory, None if args.plan else args.baseline, args.throughput, args.target,
                                args.extrapolate, args.level, args.resamples, args.resample_seed))
        else:
            print(report(directory, args.acts, None if args.plan else args.baseline, args.target_diff))
        print(f"wrote {directory / 'sweep.md'}, sweep.json and the PNGs there")
        if missing := sweep_status.missing_text(directory):
            print(missing)


if __name__ == "__main__":
    main()
