"""What runs when: the runs of one sweep directory in the order they start, each handed to the plan's launcher.

Runs go seed by seed (every variant's seed 1, then seed 2 ...), so that a sweep stopped early still pairs every
variant with its baseline; a ladder's, size by size within a seed. A ladder whose lr grid is at one size (lr_size)
runs that grid first, then every other size at each arm's best lr of the grid and the tuning audit at the largest size
(AfterGrid: on SLURM a job that waits for the grid's jobs, so one submission runs the whole ladder); a pick at the
grid's edge stops it there, unless the plan allows it (--allow-edge-lr). A run whose final evaluation is
logged is skipped; an unfinished one continues from its newest checkpoint (--auto-resume). A variant's later seeds
run the activation kernels' path its first seed decided (the trainer's --kernels-from). OUT/sweep_plan.json records
what the directory's sweep runs, so that the same directory never mixes two sweeps' runs.
"""
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from analysis.runs import finished, load_run, summary
from errors import ConfigError
from sweep import launchers, status
from sweep.cost import bench_rates, cost_text, rerun_text, run_rates
from stats import lr_audit
from stats.lr_audit import AUDIT_SEEDS
from stats.lr_grid import audit_lrs
from analysis.ladder_audit import AFTER_AUDIT
from sweep.plan import Plan, grid_pick, lr_at, power_of_horizon, run_dir


def train_argv(plan, variant_options, seed, path, overrides):
    """The trainer script and its options for one run (a launcher puts python or torchrun before it)."""
    return [str(plan.script), "--config", plan.config, *variant_options, "--seed", str(seed),
            "--out-dir", str(path), "--auto-resume", *overrides]


def run_sweep(plan, out, corpus_options=()):
    """The runs of one sweep directory: every variant x seed, with the corpus options (if any) before the plan's
    overrides. Returns the runs still queued on a scheduler (none for the sequential and local launchers)."""
    overrides = [*corpus_options, *plan.overrides]
    ladder = plan.ladder
    if ladder is None:  # seed by seed: a sweep stopped early still pairs every variant with its baseline
        phases = [[(label, opts, seed, None, None) for seed in plan.seeds for label, opts, _ in plan.variants]]
    else:
        grid_sizes = ladder.grids()
        lrs = {label: ladder.lrs for label in plan.labels}
        rest = [size for size in ladder.sizes if size not in grid_sizes or ladder.lr_seeds]
        # the other sizes (with lr_seeds, every size) run at each arm's best lr of the whole grid, known once every
        # grid run finished; their FLOPs do not depend on it
        phases = [ladder_jobs(plan, grid_sizes, lrs, grid_seeds(plan)),
                  ladder_jobs(plan, rest, {label: [None] for label in lrs}) + audit_jobs(plan, {})]
    sizes = list(plan.size_options) if ladder else [None]
    own_seeds = set(grid_seeds(plan)) if ladder and ladder.lr_seeds else set()
    runs = sorted(((size, [*opts, *overrides], "lr grid" if i == 0 and ladder else "tuning audit" if seed in
                    own_seeds else "ladder") for i, phase in enumerate(phases) for _, opts, seed, size, _ in phase),
                  key=lambda run: sizes.index(run[0]))  # the plan's order of sizes
    print(cost_text(plan.trainer, plan.config, [run[:2] for run in runs], *throughput(plan, out),
                    plan.nproc_per_node, [run[2] for run in runs]))
    if ladder and ladder.rerun_refuted:
        again = [run[:2] for run in runs if run[2] == "ladder" and run[0] != ladder.lr_size]
        print(rerun_text(plan.trainer, plan.config, again, [run[:2] for run in runs]))
    if plan.dry_run:
        if text := submission_text(plan, out, phases):
            print(text)
        for label, opts, seed, size, lr in phases[0]:
            path = run_dir(out, label, seed, size, lr)
            print(f"{path}: {' '.join(train_argv(plan, opts, seed, path, overrides))}")
        for label, _, seed, size, lr in [job for phase in phases[1:] for job in phase]:
            print(f"{label} size {size} seed {seed}: after the lr grid, " + (
                f"the tuning audit at {lr} {label}'s best lr" if lr else f"at {label}'s best lr"))
        return []
    scheduler = launcher(plan, out) if launchers.LAUNCHERS[plan.resources.kind].queues else None
    if scheduler:  # nothing submitted that it could never finish, the job after the grid included
        scheduler.preflight(after=bool(ladder and phases[1]))
    new_out, new_plan = not out.exists(), not (out / "sweep_plan.json").exists()
    write_plan(plan, overrides, out)
    try:
        queued = launch(plan, overrides, out, phases[0])
    except ConfigError:  # a refused submission leaves nothing a corrected rerun would take for this sweep
        if new_plan:
            (out / "sweep_plan.json").unlink()
        for folder in [out / "submitit", *([out] if new_out else [])]:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    if ladder is None or not phases[1]:
        return queued
    if not queued:
        return AfterGrid(plan, out, overrides, rest)()
    submit_after_grid(scheduler, plan, out, overrides, rest, queued)
    return queued


def submit_after_grid(scheduler, plan, out, overrides, sizes, queued):
    """The grid's jobs are on a scheduler: a job of its own picks the lrs once they end, then submits the sizes
    (AfterGrid), unless such a job already waits on them."""
    after = scheduler.waits_on(queued)
    record = read_after_grid(out)
    if set(after) <= set(record.get("after", [])) and launchers.still_queued(
            record, launchers.job_states({"after_grid": record}, out / "submitit").get("after_grid")):
        tqdm.write(f"job {record['job_id']} already waits for the lr grid to run sizes {', '.join(sizes)}")
        return
    token = uuid.uuid4().hex  # recorded first: the job may start before sbatch has answered
    write_after_grid(out, launcher=scheduler.name, job_id=None, after=after, token=token, state="submitted",
                     error=None)
    try:
        job_id = scheduler.launch_after(after, AfterGrid(plan, out, overrides, sizes, token))
    except ConfigError as e:
        write_after_grid(out, state="not submitted", error=str(e))
        raise
    write_after_grid(out, job_id=job_id)
    audit = plan.ladder.audit_size
    tqdm.write(f"job {job_id}: once the lr grid's jobs ({', '.join(after)}) end, picks each arm's lr and submits "
               f"sizes {', '.join(sizes)}" + (f" and the tuning audit at {audit}" if audit else ""))


@dataclass(frozen=True)
class AfterGrid:
    """A ladder's runs after its lr grid: each arm's best lr of the finished grid (stats/lr_grid.py's rule), then
    every size of `sizes` at it and the tuning audit; a pick at the grid's edge stops here with a line saying what to
    do, unless the plan allows it. On a scheduler this is a job of its own, started when the grid's jobs end, so that
    the pick reads the finished grid; OUT/after_grid.json records it (the sweep's status reads it), and only the job
    whose token it names goes on (a rerun of the submit command may have submitted a newer one)."""
    plan: Plan
    out: Path
    overrides: list
    sizes: list
    token: str | None = None  # the scheduled job's; None: run here, now

    def __call__(self):
        plan, ladder, out = self.plan, self.plan.ladder, self.out
        if self.token and read_after_grid(out).get("token") != self.token:
            return []
        if self.token:
            write_after_grid(out, state="running")
        grid = {(label, size): {lr: {seed: run_dir(out, label, seed, size, lr) for seed in grid_seeds(plan)}
                                for lr in ladder.lrs} for label in plan.labels for size in ladder.grids()}
        unfinished = [path.name for lrs in grid.values() for seeds in lrs.values() for path in seeds.values()
                      if not finished(path)]
        try:
            if unfinished:
                raise ConfigError(f"the lr grid has {len(unfinished)} unfinished run(s) ({', '.join(unfinished[:4])}"
                                  f"{' ...' if len(unfinished) > 4 else ''}); rerun the sweep to finish it")
            picks = {key: grid_pick(key[0], dirs) for key, dirs in grid.items()}
            if (edges := [(a, p) for a, p in picks.items() if p["edge"]]) and not plan.allow_edge_lr:
                raise ConfigError("; ".join(
                    f"{a}'s best lr {p['best_lr']:g} at size {size} is the grid's "
                    f"{'lowest' if p['edge'] == 'low' else 'highest'}" for (a, size), p in edges)
                    + ": the optimum may lie outside the grid. Extend lrs " + " and ".join(sorted(
                        {'downward' if p['edge'] == 'low' else 'upward' for _, p in edges})) + " and rerun with a new "
                    "--out-dir, or pass --allow-edge-lr to run the ladder at the edge")
            lrs = size_lrs(plan, picks, self.sizes)
        except ConfigError as e:
            if not self.token:
                raise
            # the scheduled job's decision, not its failure: a state with its sentence (--status), the job ends well
            write_after_grid(out, state="stopped", error=str(e))
            tqdm.write(f"stopped: {e}")
            return []
        best = {label: lrs[label][ladder.audit_size or self.sizes[-1]] for label in plan.labels}
        tqdm.write("lr by size: " + "; ".join(f"{a} " + ", ".join(f"{s} {lr:g}" for s, lr in by_size.items())
                                               for a, by_size in lrs.items()))
        jobs = ladder_jobs(plan, self.sizes, {a: {size: [lr] for size, lr in by_size.items()}
                                              for a, by_size in lrs.items()}) + audit_jobs(plan, best)
        if not self.token:
            return self.after_audit(launch(plan, self.overrides, out, jobs), lrs)
        write_after_grid(out, state="ended", best=best, lrs=lrs)
        try:
            return self.after_audit(launch(plan, self.overrides, out, jobs), lrs)
        except ConfigError as e:
            write_after_grid(out, state="not submitted", error=str(e))
            raise

    def after_audit(self, queued, lrs):
        """With the plan's rerun_refuted, AfterAudit once the sizes and the audit have ended: here, now, where they
        ran here; else a job after theirs. Returns the runs still queued."""
        if not self.plan.ladder.rerun_refuted:
            return queued
        after = AfterAudit(self.plan, self.out, self.overrides, lrs)
        if not queued:
            return after()
        scheduler = launcher(self.plan, self.out)
        job_id = scheduler.launch_after(scheduler.waits_on(queued), after)
        launchers.write_job(self.out, AFTER_AUDIT, job_id=job_id, state="submitted")
        tqdm.write(f"job {job_id}: once the sizes' and the audit's jobs end, re-runs each arm whose lr the audit "
                   "does not put within the tolerance at its audited optimum")
        return queued


@dataclass(frozen=True)
class AfterAudit:
    """The plan's rerun_refuted: once the tuning audit has ended, each arm whose lr it does not put within the
    tolerance (stats/lr_audit.py's audit, the report's defaults) runs again at every size above lr_size, on the
    sweep's seeds, at lrs re-interpolated as a power of the horizon (log lr linear in log steps) between its lr at
    lr_size and its audited optimum at the audit's size. OUT/after_audit.json records each arm's audit status, its
    new lrs ("reruns", which the report then uses for that arm) or why it cannot run again ("why_not": an audit
    without an optimum, or unfinished). lrs: {arm: {size: the lr it ran}}."""
    plan: Plan
    out: Path
    overrides: list
    lrs: dict

    def __call__(self):
        plan, ladder, out = self.plan, self.plan.ladder, self.out
        steps = {name: table["max_steps"] for name, table in ladder.sizes.items()}
        status, reruns, why_not = {}, {}, {}
        for label in plan.labels:
            picked = self.lrs[label][ladder.audit_size]
            dirs = {lr: [run_dir(out, label, seed, ladder.audit_size, lr) for seed in ladder.audit_seed_list()]
                    for lr in audit_lrs(picked, ladder.lrs)}
            if unfinished := [p.name for paths in dirs.values() for p in paths if not finished(p)]:
                why_not[label] = f"its audit has unfinished runs ({', '.join(unfinished[:4])})"
                continue
            x = lr_audit.audit(picked, {lr: {i: summary(load_run(p))["final_val"] for i, p in enumerate(paths)}
                                        for lr, paths in dirs.items()})
            status[label] = "no audit" if x is None else x["status"]
            if x is None or x["status"] == "within":
                continue
            if x["optimum"] is None:
                why_not[label] = "its audit losses do not curve upward about a minimum: no optimum to run at"
                continue
            ends = [steps[ladder.lr_size], steps[ladder.audit_size]]
            reruns[label] = {size: power_of_horizon(ends, [self.lrs[label][ladder.lr_size], x["optimum"]], steps[size])
                             if ends[0] != ends[1] else float(f"{x['optimum']:.3g}")  # one horizon: no power of it
                             for size in self.lrs[label] if size != ladder.lr_size}
        launchers.write_job(out, AFTER_AUDIT, state="ended", status=status, reruns=reruns, why_not=why_not)
        if reruns:
            tqdm.write("re-run at the audited optimum: " + "; ".join(
                f"{a} " + ", ".join(f"{s} {lr:g}" for s, lr in by_size.items()) for a, by_size in reruns.items()))
        jobs = ladder_jobs(plan, [s for s in self.lrs[plan.labels[0]] if s != ladder.lr_size],
                           {a: {size: [lr] for size, lr in reruns[a].items()} if a in reruns else
                            {size: [] for size in self.lrs[a]} for a in plan.labels})
        return launch(plan, self.overrides, out, jobs)


def size_lrs(plan, picks, sizes):
    """{arm: {size: its lr}} from the grids' picks {(arm, grid size): pick}: the best lr at every size (design
    smallest), or the grids' vertices as a power of the horizon (sweep/plan.py lr_at)."""
    ladder = plan.ladder
    if ladder.design == "smallest":
        return {a: {size: picks[(a, ladder.lr_size)]["best_lr"] for size in sizes} for a in plan.labels}
    return {a: {size: lr_at(ladder, {g: picks[(a, g)] for g in ladder.grids()}, size) for size in sizes}
            for a in plan.labels}


def read_after_grid(out):
    return launchers.read_job(out, launchers.AFTER_GRID)


def write_after_grid(out, **changes):
    return launchers.write_job(out, launchers.AFTER_GRID, **changes)


def submission_text(plan, out, phases):
    """What the plan's launcher would submit (the dry run): each job it asks its scheduler for; None without one."""
    todo = [label for label, _, seed, size, lr in phases[0] if not finished(run_dir(out, label, seed, size, lr))]
    jobs = [(f"job array of {len(todo)} runs" + (" (the lr grid)" if len(phases) > 1 else ""), len(todo), False)]
    if len(phases) > 1 and phases[1]:
        if todo:  # else this command picks the lrs itself
            jobs.append(("job after the lr grid (picks each arm's lr, submits the array below)", 1, True))
        audit = f", the tuning audit at {plan.ladder.audit_size}" if plan.ladder.audit_size else ""
        jobs.append((f"job array of {len(phases[1])} runs (the other sizes, at each arm's lr{audit})",
                     len(phases[1]), False))
    return launchers.LAUNCHERS[plan.resources.kind].submission_text(plan.resources, plan.nproc_per_node,
                                                                    out / "submitit", jobs)


def throughput(plan, out):
    """({act: FLOP/s per GPU}, its source) for the cost line: --throughput files, else this sweep's finished runs."""
    if plan.throughput:
        return bench_rates(plan.throughput)
    return run_rates([out] if out.is_dir() else [])


def write_plan(plan, overrides, out):
    """OUT/sweep_plan.json: what the sweep runs, so that the same directory never mixes two sweeps' runs."""
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "sweep_plan.json"
    ladder = plan.ladder
    record = {"trainer": plan.trainer, "config": plan.config, "overrides": overrides,
              "nproc_per_node": plan.nproc_per_node, "variants": {label: opts for label, opts, _ in plan.variants},
              "ladder": ladder and {"sizes": plan.size_options, "lrs": ladder.lrs, "lr_size": ladder.lr_size,
                                    **({"lr_seeds": ladder.lr_seeds} if ladder.lr_seeds else {}),
                                    **({"audit_size": ladder.audit_size} if ladder.audit_size else {}),
                                    **({"lr_design": ladder.design, "grid_sizes": ladder.grid_sizes}
                                       if ladder.design != "smallest" else {}),
                                    **({"rerun_refuted": True} if ladder.rerun_refuted else {}),
                                    **({"audit_seeds": ladder.audit_seeds} if ladder.audit_seeds != AUDIT_SEEDS
                                       else {})}}
    kept = ("trainer", "config", "overrides", "nproc_per_node", "ladder")
    if plan_path.exists():  # the same variant in the same directory must mean the same run
        old = {"trainer": "gpt2", **json.loads(plan_path.read_text())}
        old_variants = old.get("variants") or {a: ["--act", a] for a in old.get("acts", [])}
        if ({k: old.get(k) for k in kept} != {k: record[k] for k in kept}
                or any(old_variants.get(label, opts) != opts for label, opts in record["variants"].items())):
            raise SystemExit(f"error: {out} holds a sweep with other settings ({old['config']} "
                             f"{' '.join(old['overrides'])}); use another --out-dir so finished runs are not mixed")
    plan_path.write_text(json.dumps({**record, "acts": plan.labels, "seeds": plan.seeds, "baseline": plan.baseline,
                                     "control": plan.control, "baselines": {v.label: v.baseline for v in plan.variants},
                                     "runs": status.planned_runs(plan, out)}, indent=2))


def grid_seeds(plan):
    """The lr grid's seeds: the plan's lr_seeds (the lr is then chosen on other seeds than it is compared on), else
    the sweep's."""
    return plan.ladder.lr_seeds or plan.seeds


def ladder_jobs(plan, sizes, lrs, seeds=None):
    """(label, options, seed, size, lr) of each run, seed by seed (seeds: the sweep's by default), then size by size:
    a ladder stopped early still has every arm and size on its first seeds. lrs: {label: [lr]}, or {label: {size:
    [lr]}} where the lr depends on the size."""
    return [(label, [*opts, *plan.size_options[size], *plan.lr_options(lr)], seed, size, lr)
            for seed in seeds or plan.seeds for size in sizes for label, opts, _ in plan.variants
            for lr in (lrs[label][size] if isinstance(lrs[label], dict) else lrs[label])]


def audit_jobs(plan, best):
    """The tuning audit's runs: every arm at the largest size on the grid's first audit_seeds seeds (its vertex's
    interval needs residuals besides the seeds' levels: stats/lr_audit.py), at the 4 lrs around its best
    lr (stats/lr_grid.py's audit_lrs). best: {arm: its best lr}; {} before the grid has picked: then each job's lr is
    its factor of the pick (such as "0.354x"), for the dry run's words, and its options hold no lr (its FLOPs need none)."""
    ladder = plan.ladder
    if not ladder.audit_size:
        return []
    if not best:
        factors = [f"{f:g}x" for f in audit_lrs(1, ladder.lrs)]
        return [(label, [*opts, *plan.size_options[ladder.audit_size]], seed, ladder.audit_size, f)
                for seed in ladder.audit_seed_list() for label, opts, _ in plan.variants for f in factors]
    return ladder_jobs(plan, [ladder.audit_size], {a: audit_lrs(best[a], ladder.lrs) for a in plan.labels},
                       ladder.audit_seed_list())


def launch(plan, overrides, out, jobs):
    """Hands the jobs not finished yet to the launcher; returns those it left queued on a scheduler."""
    runs, created = [], set()
    for label, opts, seed, size, lr in jobs:
        path = run_dir(out, label, seed, size, lr)
        if finished(path):
            tqdm.write(f"{path}: finished, skipped")
            continue
        if not path.is_dir():
            created.add(path)
        path.mkdir(parents=True, exist_ok=True)
        # every seed of an arm on the numerical path its first seed's run decided (activations/policy.py), where
        # that run has started when this one starts (side by side, each may decide: the report names the paths)
        first = run_dir(out, label, plan.seeds[0], size, lr) if seed != plan.seeds[0] else None
        where = (f" size {size}" if size else "") + (f" lr {lr:g}" if lr else "")
        runs.append(launchers.RunCommand(path, train_argv(plan, opts, seed, path, overrides),
                                         f"{label}{where} seed {seed}", first))
    if not runs:
        return []
    try:
        return launcher(plan, out).launch(runs)
    except ConfigError:  # refused (sbatch): no new directory left behind for a corrected rerun to find
        for path in created:
            if not any(path.iterdir()):
                path.rmdir()
        raise


def launcher(plan, out):
    return launchers.LAUNCHERS[plan.resources.kind](plan.resources, plan.nproc_per_node, out / "submitit")
