"""Train one config over several activations and seeds, then compare them with paired statistics.

    python -m analysis.sweep --config configs/gpt2_cpu_tiny.toml --acts gelu,aglu,nswish --seeds 1,2,3 \\
        --out-dir runs/sweep --max-steps 300            # any further --key value goes to train_gpt2.py
    python -m analysis.sweep ... --nproc-per-node 8          # each run under torchrun
    python -m analysis.sweep --report-only runs/sweep        # re-read the runs, rewrite the report

Runs go one after another, each a subprocess writing to OUT_DIR/{act}_seed{seed} (its output in train.out).
A run whose final evaluation is logged is skipped; an unfinished one continues from its newest checkpoint
(--resume), so rerunning the same command after a crash finishes the sweep. The report (stdout,
OUT_DIR/sweep.md, sweep.json, compare.png, compare_telemetry.png) has mean ± sample std per activation of the final val loss
(and HellaSwag acc_norm / BLEU where logged), and for each activation the paired difference to the
baseline (first of --acts, or --baseline) over the seeds both finished: mean, std, t = mean / (std/sqrt n)
and the 95% interval mean ± t_{0.975, n-1} std/sqrt(n). Negative val-loss differences favour the activation.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tqdm import tqdm

import activations
from analysis.compare import plot, plot_telemetry, table
from analysis.runs import RunError, load_run, load_runs, markdown_table, summary
from eval.stats import mean_std, paired

TRAINER = ROOT / "train_gpt2.py"
METRICS = [("final_val", "final val loss"), ("hella_acc_norm", "HellaSwag acc_norm"), ("bleu", "BLEU")]
RESERVED = {"--act", "--seed", "--out-dir", "--out_dir", "--resume", "--config"}
def run_dir(out_dir, act, seed):
    return Path(out_dir) / f"{act}_seed{seed}"


def finished(path):
    """The run's final evaluation (at max_steps) is logged."""
    try:
        run = load_run(path)
    except RunError:
        return False
    val, max_steps = run.series.get("val"), run.setting("max_steps")
    return bool(val) and max_steps is not None and val[-1][0] == max_steps


def train_command(config, act, seed, path, overrides, nproc):
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={nproc}"]
    return [*launcher, str(TRAINER), "--config", config, "--act", act, "--seed", str(seed), "--out-dir", str(path),
            "--resume", *overrides]


def run_sweep(args, overrides):
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "sweep_plan.json"
    plan = {"config": args.config, "overrides": overrides, "nproc_per_node": args.nproc_per_node}
    if plan_path.exists():
        old = json.loads(plan_path.read_text())
        if {k: old.get(k) for k in plan} != plan:
            raise SystemExit(f"error: {out} holds a sweep with other settings ({old['config']} {' '.join(old['overrides'])}); "
                             "use another --out-dir so finished runs are not mixed")
    plan_path.write_text(json.dumps({**plan, "acts": args.acts, "seeds": args.seeds, "baseline": args.baseline}, indent=2))
    jobs = [(act, seed) for act in args.acts for seed in args.seeds]
    for act, seed in tqdm(jobs, desc="sweep", unit="run"):
        path = run_dir(out, act, seed)
        if finished(path):
            tqdm.write(f"{path}: finished, skipped")
            continue
        path.mkdir(parents=True, exist_ok=True)
        cmd = train_command(args.config, act, seed, path, overrides, args.nproc_per_node)
        tqdm.write(f"{path}: {' '.join(cmd[1:])}")
        with open(path / "train.out", "a") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0 or not finished(path):
            tail = (path / "train.out").read_text().strip().splitlines()[-1:] or [""]
            raise SystemExit(f"error: {act} seed {seed} stopped (exit code {code}): {tail[0][:200]} -- see "
                             f"{path / 'train.out'}; rerun the same command to continue (finished runs are skipped)")


def report(out_dir, acts=None, baseline=None):
    """Read every run under out_dir and write sweep.md, sweep.json and compare.png there; returns the markdown."""
    out = Path(out_dir)
    plan = json.loads((out / "sweep_plan.json").read_text()) if (out / "sweep_plan.json").is_file() else {}
    dirs = sorted(p for p in out.iterdir() if p.is_dir() and ((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file()))
    if not dirs:
        raise SystemExit(f"error: {out}: no run directories (with log.txt or metrics.jsonl) inside")
    try:
        runs = load_runs(dirs)
    except RunError as e:
        raise SystemExit(f"error: {e}") from None
    done = [run for run in runs if finished(run.path)]
    unfinished = [run.label for run in runs if run not in done]
    order = acts or plan.get("acts") or sorted({r.setting("act") for r in done})
    order = [a for a in order if any(r.setting("act") == a for r in done)]
    rank = {a: i for i, a in enumerate(order)}
    runs.sort(key=lambda r: (rank.get(r.setting("act"), len(rank)), str(r.setting("act")), r.setting("seed") or 0))
    baseline = baseline or plan.get("baseline") or (order[0] if order else None)

    rows = {a: {} for a in order}  # act -> metric -> {seed: value}
    for run in done:
        if run.setting("act") in rows:
            s = summary(run)
            for key, _ in METRICS:
                if s[key] is not None:
                    rows[run.setting("act")].setdefault(key, {})[run.setting("seed")] = s[key]
    metrics = [(k, name) for k, name in METRICS if any(k in r for r in rows.values())]
    result = {"baseline": baseline, "acts": order, "unfinished": unfinished, "runs": [summary(r) for r in runs],
              "per_act": {a: {k: mean_std(list(rows[a].get(k, {}).values())) for k, _ in metrics} for a in order},
              "paired": {a: {k: paired(rows[baseline].get(k, {}), rows[a].get(k, {})) for k, _ in metrics}
                         for a in order if a != baseline and baseline in rows}}

    def pm(stat):
        if stat["mean"] is None:
            return "-"
        return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if stat["std"] is not None else f"{stat['mean']:.4f}"

    md = [f"# Sweep {out}", "", table(runs), ""]
    if unfinished:
        md += [f"Unfinished (left out of the statistics): {', '.join(unfinished)}", ""]
    md += ["Mean ± sample std over seeds:", "",
           markdown_table(["act", "n", *[name for _, name in metrics]],
                          [[a, max((s["n"] for s in result["per_act"][a].values()), default=0),
                            *[pm(result["per_act"][a][k]) for k, _ in metrics]] for a in order]), ""]
    sources = set()
    pair_rows = []
    for a, per in result["paired"].items():
        for k, name in metrics:
            p = per[k]
            sources.add(p["t_source"])
            pair_rows.append([f"{a} - {baseline}", name, p["n"], pm(p), "-" if p["t"] is None else f"{p['t']:.2f}",
                              "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]"])
    if pair_rows:
        md += [f"Paired differences against {baseline} over shared seeds (mean ± std, t = mean/(std/√n), 95% CI "
               f"with t quantile from {', '.join(sorted(s for s in sources if s)) or 'n/a (n < 2)'}); "
               "val loss: negative is better, HellaSwag/BLEU: positive is better:", "",
               markdown_table(["pair", "metric", "n", "diff", "t", "95% CI"], pair_rows), ""]
    text = "\n".join(md)
    (out / "sweep.md").write_text(text)
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    try:
        plot(runs, out / "compare.png")
        if any(r.telemetry for r in runs):
            plot_telemetry(runs, out / "compare_telemetry.png")
    except RunError as e:  # nothing logged yet: the tables still stand
        text += f"\n(no plot: {e})"
    return text


def seed_list(text):
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,3, got {text!r}") from None


def parse_args(argv):
    # no abbreviations: a trainer option such as --act must not be taken for --acts
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--config", help="trainer TOML config (e.g. configs/gpt2_cpu_tiny.toml)")
    p.add_argument("--acts", type=lambda s: [a for a in s.split(",") if a], help="comma-separated activations")
    p.add_argument("--seeds", type=seed_list, help="comma-separated seeds")
    p.add_argument("--out-dir", help="sweep directory: one sub-directory per run, plus the report")
    p.add_argument("--baseline", help="activation the others are compared against (default: first of --acts)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes per run; >1 uses torchrun")
    p.add_argument("--report-only", metavar="DIR", help="only read the runs in DIR and write the report")
    args, overrides = p.parse_known_args(argv)
    if args.report_only:
        if overrides:
            p.error(f"--report-only only reads runs; unexpected {' '.join(overrides)}")
        return args, overrides
    missing = [f"--{n.replace('_', '-')}" for n in ("config", "acts", "seeds", "out_dir") if not getattr(args, n)]
    if missing:
        p.error(f"missing {', '.join(missing)} (or use --report-only DIR)")
    clash = [o.split("=")[0] for o in overrides if o.split("=")[0] in RESERVED]
    if clash:
        p.error(f"{', '.join(clash)} is set by the sweep for each run; remove it from the trainer options")
    unknown = [a for a in args.acts if a not in activations.available()]
    if unknown:
        p.error(f"unknown activation(s) {', '.join(unknown)}; choose from {', '.join(activations.available())}")
    if args.baseline and args.baseline not in args.acts:
        p.error(f"--baseline {args.baseline} is not one of --acts {','.join(args.acts)}")
    if args.nproc_per_node < 1:
        p.error("--nproc-per-node must be at least 1")
    args.baseline = args.baseline or args.acts[0]
    return args, overrides


def main(argv=None):
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        run_sweep(args, overrides)
    out = args.report_only or args.out_dir
    if not Path(out).is_dir():
        raise SystemExit(f"error: {out}: no such sweep directory")
    print(report(out, args.acts, args.baseline))
    print(f"wrote {Path(out) / 'sweep.md'}, sweep.json and the PNGs there")


if __name__ == "__main__":
    main()
