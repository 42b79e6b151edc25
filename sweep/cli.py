"""Train one config over several activations and seeds, then compare them with paired statistics.

    python -m sweep --config configs/gpt2_cpu_tiny.toml --acts gelu,aglu,nswish --seeds 1,2,3 \\
        --out-dir runs/sweep --max-steps 300            # any further --key value goes to the trainer
    python -m sweep ... --nproc-per-node 8          # each run under torchrun
    python -m sweep --plan configs/sweep_translation_acts.toml --out-dir runs/translation_acts
    python -m sweep --config configs/gpt2_cpu_tiny.toml --acts gelu,swiglu,aglu,aglu_glu --seeds 1,2,3 \
        --out-dir runs/glu                                # gated MLPs (swiglu, NAME_glu) beside plain ones
    python -m sweep --report-only runs/sweep        # re-read the runs, rewrite the report(s)
    python -m sweep --report-only runs/sweep --target-diff 0.01   # seeds to detect 0.01 nats
    python -m sweep ... --control                   # with an A/A control, reported first
    python -m sweep --plan configs/ladder_cpu.toml --out-dir runs/ladder_cpu   # sizes x lrs: a ladder
    python -m sweep --report-only runs/ladder_cpu --throughput FILE       # + wall-clock multiplier
    python -m sweep --plan configs/ladder_gpu.toml --out-dir runs/ladder_gpu --nproc-per-node 8 \
        --launcher slurm [--dry-run]      # SLURM jobs (docs/cluster.md); --dry-run: cost, #SBATCH lines, runs, stop
    python -m sweep --status runs/ladder_gpu     # every run: state, job, requeues, last logged step
    python -m sweep --report-only runs/ladder_cpu --target 1e13 --level 0.9 --resamples 2000

--trainer gpt2 (train_gpt2.py, the default) or translation (train_translation.py). A --plan TOML file names
the trainer, config and seeds, the variants (a label each, with its trainer options such as act,
act_kwargs, plain_top_k, and the label it is compared against as `baseline`) and optionally corpora
(a name each, with trainer options such as train_prefix): each corpus is a sweep of its own in
OUT_DIR/{corpus}. Before anything runs, the sweep prints its cost (sweep/cost.py: FLOPs per run, per size and
in all; GPU-hours with --throughput or finished runs). Runs go one after another, seed by seed (every variant's
seed 1, then seed 2 ...), each a subprocess writing to OUT_DIR[/{corpus}]/{label}_seed{seed} (its output in
train.out); --launcher local or slurm (or the plan's [launcher] table) runs them side by side or as SLURM jobs
instead (sweep/launchers/). A variant's later seeds
run the activation kernels' path its first seed decided (the trainer's --kernels-from), or the one its options
pin (act_kwargs {"impl": ...}); the report names each variant's path. A run whose final
evaluation (translation: its test-set BLEU) is logged is skipped; an unfinished one continues from its newest
checkpoint (--auto-resume), so rerunning the same command after a crash finishes the sweep.

A ladder (sweep/plan.py): `lrs = [...]` (or --lrs) and [sizes.NAME] tables in a plan run every arm at
every lr and size, each run in OUT_DIR/{label}_{size}_lr{lr}_seed{seed}; its report is analysis/ladder_report.py's
(each arm's lr and how it was chosen, compute multiplier fitted and curve-free, trend, the interval's measured
coverage, every verdict under Holm, the tuning audit), read from the runs' run.json, whatever their directories'
names (an arm named by the plan's variant whose options its runs hold). With `lr_size` the grid runs at one size
first; a pick at its edge stops the plan there unless --allow-edge-lr. Its report's options: --target (none by
default: no extrapolation unless --extrapolate), --reference (the headline's compute, default the largest rung),
--level, --resamples, --resample-seed.

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
import os
import sys
from pathlib import Path

from analysis.ladder_points import is_ladder
from analysis.ladder_report import ReportOptions, ladder_report
from analysis.sweep_report import report
from errors import ConfigError
from sweep import launchers, status
from sweep.plan import TRAINERS, from_args
from sweep.schedule import run_sweep


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


def parser():
    # no abbreviations: a trainer option such as --act must not be taken for --acts
    p = argparse.ArgumentParser(prog="python -m sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
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
    p.add_argument("--allow-edge-lr", action="store_true",
                   help="run a ladder's sizes at a pick on its lr grid's edge (by default that stops the plan, "
                        "naming the arm and which way to extend lrs)")
    p.add_argument("--status", metavar="DIR", help="every run of the sweep in DIR: state, job, last logged step")
    p.add_argument("--report-only", metavar="DIR", help="only read the runs in DIR and write the report")
    p.add_argument("--throughput", action="append", metavar="FILE",
                   help="a ladder's wall-clock multiplier: bench/train_step.py --json FILE of the arms at a ladder "
                        "size, timed interleaved on one machine (repeat for more sizes)")
    p.add_argument("--target", metavar="FLOPS",
                   help="a ladder's multiplier also at this compute (FLOPs on the ladder's data) or gpt2-124m-10b; "
                        "beyond 10x the largest size or on another vocabulary only with --extrapolate")
    p.add_argument("--reference", type=float, metavar="FLOPS",
                   help="the compute at which a ladder's headline multiplier is read (default: its largest rung; "
                        "inside the ladder: --target reads beyond it)")
    p.add_argument("--extrapolate", action="store_true",
                   help="allow a --target the ladder cannot support, printed and drawn as an extrapolation")
    p.add_argument("--level", type=float, default=0.95,
                   help="a ladder's interval level; its verdicts hold at family-wise error rate 1 - level (Holm)")
    p.add_argument("--resamples", type=int, default=400,
                   help="simulated ladders that measure the coverage of a ladder's multiplier interval")
    p.add_argument("--resample-seed", type=int, default=0, help="the seed of those simulations")
    p.add_argument("--lr-tolerance", type=float, default=ReportOptions.tolerance, metavar="FACTOR",
                   help="how far from its audited optimum an arm's lr may lie: beyond it (every optimum in the "
                        "audit's interval), the arm's multipliers and trends are not declared")
    p.add_argument("--target-diff", type=float, metavar="NATS",
                   help="final val loss difference whose seeds the report counts (default: the observed one)")
    return p


def parse_args(argv):
    """(the command line's options, the Plan of the sweep it runs: None for --report-only and --status, which only
    read runs); a plan that cannot run is one line naming the plan file (no usage: the command line was right)."""
    p = parser()
    args, overrides = p.parse_known_args(argv)
    if args.report_only or args.status:
        if overrides:
            p.error(f"--report-only and --status only read runs; unexpected {' '.join(overrides)}")
        return args, None
    try:
        return args, from_args(args, overrides)
    except ConfigError as e:
        where = f"--plan {args.plan}: " if args.plan and f"--plan {args.plan}" not in str(e) else ""
        print(f"error: {where}{e}", file=sys.stderr)
        raise SystemExit(2) from None


def sweep_dirs(out):
    """out itself when it holds runs, else its sub-directories that hold a sweep (one per corpus)."""
    out = Path(out)
    if any((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file() for p in out.iterdir() if p.is_dir()):
        return [out]
    return sorted(p for p in out.iterdir() if (p / "sweep_plan.json").is_file()) or [out]


def run(plan, out):
    """Runs the plan (each corpus a sweep of its own); False when runs are left queued on a scheduler or for a dry
    run: no report yet."""
    queued = []
    try:
        for corpus, corpus_options in plan.corpora or [(None, [])]:
            queued += run_sweep(plan, out / corpus if corpus else out, corpus_options)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if queued:
        after_grid = plan.ladder and plan.ladder.lr_size  # a ladder's other sizes wait in a job after its grid
        print(f"{len(queued)} runs queued as {plan.resources.kind} jobs (job.json in each run's directory)"
              + (", the ladder's sizes after its lr grid in a job that waits for it" if after_grid else "")
              + f". Follow them with `python -m sweep --status {out}`; once they end, run this command again: it "
              "skips finished runs, leaves queued ones alone, resubmits failed ones and writes the report")
    return not (queued or plan.dry_run)


def main(argv=None):
    try:
        dispatch(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:  # `--status DIR | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush does not fail
        raise SystemExit(1) from None


def dispatch(argv):
    args, plan = parse_args(argv)
    if args.status:
        if not Path(args.status).is_dir():
            raise SystemExit(f"error: {args.status}: no such sweep directory")
        for directory in sweep_dirs(args.status):
            print(status.status_text(directory))
        return
    out = Path(args.report_only or args.out_dir)
    if plan and not run(plan, out):
        return
    if not out.is_dir():
        raise SystemExit(f"error: {out}: no such sweep directory")
    acts, baseline = (plan.labels, plan.baseline) if plan else (args.acts, args.baseline)
    for directory in sweep_dirs(out):
        if is_ladder(directory):
            print(ladder_report(directory, None if args.plan else baseline, args.throughput, ReportOptions(
                args.target, args.extrapolate, args.level, args.resamples, args.resample_seed, args.reference,
                args.lr_tolerance)))
        else:
            print(report(directory, acts, None if args.plan else baseline, args.target_diff))
        print(f"wrote {directory / 'sweep.md'}, sweep.json and the PNGs there")
        if missing := status.missing_text(directory):
            print(missing)
