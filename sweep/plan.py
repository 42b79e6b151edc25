"""A sweep's plan, read once into one frozen Plan: the trainer, its config and seeds, the variants (each a label, its
trainer options and the label it is compared against), the corpora, the A/A control, the ladder, the launcher's
resources and the trainer options after the sweep's own. From a --plan TOML file (trainer, config, seeds, control,
[variants.LABEL], [corpora.NAME], [launcher]) or from --acts; the command line's options win over the file's.

Beside those, a plan file may name a ladder:

    lrs = [1e-3, 2e-3, 4e-3]   # every arm at every lr, log-spaced (or `python -m sweep --lrs 1e-3,2e-3,4e-3`)
    lr_size = "s2"             # optional: the grid at this size only; the other sizes then run each arm at the best
                               # lr the grid picked for it (stats/lr_grid.py's rule), after the whole grid
    lr_seeds = [11, 12]        # optional: the grid on these seeds, disjoint from `seeds`; then every size, lr_size
                               # too, runs each arm at its picked lr on `seeds`: the lr is chosen on other runs than
                               # the ones compared, so the choice's luck (a winner's curse) cannot favour an arm
    lr_design = "horizon"      # optional, with lr_seeds (stats/lr_grid.py DESIGNS): "smallest" (the default)
                               # runs every size at the grid's pick at lr_size; "horizon" grids lr_size's shape at
                               # its own steps and at the largest size's too (size LRSIZE_TLARGEST), "ends" grids the
                               # smallest and the largest size: each arm then runs each size at the grids' vertices
                               # as a power of the horizon, read at the size's steps (lr_at)
    audit_seeds = 2            # optional: the tuning audit's seeds, the first this many of lr_seeds (default 2)
    rerun_refuted = true       # optional, with the tuning audit: an arm whose lr the audit does not put within the
                               # tolerance runs again at every size above lr_size, at lrs between its pick there and
                               # its audited optimum as a power of the horizon (sweep/schedule.py AfterAudit)
    param = "completep"        # optional: every run's parametrization (model_parts/parametrization.py), with
    base_width = 64            # base_width and base_depth (else the config's): the lr then transfers across sizes,
    base_depth = 2             # so the grid runs at the smallest size (lr_size defaults to it; another is refused)
    [sizes.s1]                 # a model size (GPT-2 trainer): n_layer, n_embd, n_head and its budget, max_steps
                               # (optional: batch_size, dist, activation_checkpointing, hellaswag_interval)
    n_layer = 2
    n_embd = 64
    n_head = 2
    max_steps = 400

Sizes are ordered by their compute, n_layer x n_embd^2 x max_steps (the blocks' parameters times the tokens). With
lr_size and lr_seeds below the largest size, a tuning audit follows the grid: every arm again at the largest size, on
the first audit_seeds (2) of lr_seeds, at 4 lrs around its pick (stats/lr_grid.py's audit_lrs); the report declares
an arm's verdicts only where the audit puts its lr within its tolerance (stats/lr_audit.py). A pick at the grid's edge stops
the plan before the other sizes run (the optimum may lie outside the grid): extend lrs (in a new --out-dir), or pass
--allow-edge-lr to run the ladder at it.

Runs: arms x sizes x seeds (x lrs). What an lr sets is the trainer's to say (its optim section's `swept_lr`): the
GPT trainer's max_lr, with min_lr scaled at the config's min_lr / max_lr (the cosine schedule keeps its shape), the
translation trainer's lr (inverse square root: its whole schedule scales). The config is read as the trainer reads
it (training/config.py's load_config of its TrainConfig). Each size states its own max_steps, the same for every arm
(the same data). The rule behind a ladder's budgets is the plan's to state and a test's to check: the shipped plans
give every size a fixed number of tokens per parameter outside the embeddings (tests/test_ladder.py recomputes them
from model.py). The sweep builds models only to count a plan's FLOPs for its cost line (sweep/cost.py).
"""
import json
import math
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from analysis.runs import RunError, load_run, summary
from errors import ConfigError
from stats.lr_audit import AUDIT_SEEDS
from stats.lr_grid import DESIGNS, check_grid, pick
from sweep.launchers import Resources, read_resources

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = {"gpt2": ROOT / "train_gpt2.py", "translation": ROOT / "train_translation.py"}  # the scripts runs start
RESERVED = {"--act", "--seed", "--out-dir", "--out_dir", "--resume", "--auto-resume", "--auto_resume", "--config",
            "--init-seed-offset", "--init_seed_offset", "--kernels-from", "--kernels_from"}
# The A/A control's torch seed is seed + this: far from any seed list, so no control run shares an init stream
# with a baseline run, while the data order (the seed alone) stays the baseline's.
CONTROL_INIT_SEED_OFFSET = 1_000_000
LABEL = re.compile(r"[A-Za-z0-9.+-][A-Za-z0-9_.+-]*")
PLAN_KEYS = ("trainer", "config", "seeds", "control", "variants", "corpora", "launcher")
PARAM_KEYS = ("param", "base_width", "base_depth")  # the plan's parametrization, for every variant
TRANSFERRING = ("mup", "completep")  # parametrizations whose lr transfers across sizes (model.py)
SHAPE_KEYS = ("n_layer", "n_embd", "n_head")
SIZE_KEYS = (*SHAPE_KEYS, "max_steps")
# how a size runs, where it needs it (its memory: training/memory.py), not what it trains: optional per size
SIZE_RUN_KEYS = ("batch_size", "dist", "activation_checkpointing", "hellaswag_interval")
LADDER_KEYS = ("lrs", "lr_size", "lr_seeds", "sizes", "lr_design", "rerun_refuted", "audit_seeds")


class Variant(NamedTuple):
    label: str
    options: list  # its trainer options, e.g. ["--act", "gelu"]
    baseline: str | None  # the label it is compared against; None: the sweep's baseline


@dataclass(frozen=True)
class Ladder:
    lrs: list  # [None]: the config's lr
    sizes: dict  # name -> its table; {None: {}}: the config's size
    lr_size: str | None
    lr_seeds: list | None = None  # the grid's own seeds (None: the sweep's seeds, the choice then made on them)
    audit_size: str | None = None  # where the tuning audit re-grids every arm (the largest size)
    design: str = "smallest"  # stats/lr_grid.py DESIGNS: how each arm's lr at each size is chosen
    grid_sizes: dict | None = None  # {name: its table} where the grids run; None: lr_size alone
    rerun_refuted: bool = False  # an arm the audit does not put within the tolerance runs again (schedule.AfterAudit)
    audit_seeds: int = AUDIT_SEEDS  # the audit runs on the first this many of lr_seeds

    def audit_seed_list(self):
        return (self.lr_seeds or [])[:self.audit_seeds]

    def grids(self):
        """The sizes whose lr grids run, by name (their tables in grid_sizes or sizes)."""
        return list(self.grid_sizes) if self.grid_sizes else [self.lr_size] if self.lr_size else list(self.sizes)


class PlanFile(NamedTuple):
    """A --plan TOML file as written: what the command line may still replace."""
    trainer: str | None
    config: str | None
    seeds: list | None
    variants: list  # [Variant]
    corpora: list  # [(name, trainer options)]
    control: bool | str  # false, true or the A/A control's label
    ladder: Ladder | None
    launcher: dict | None  # its [launcher] table


@dataclass(frozen=True)
class Plan:
    """Everything a sweep runs, decided before the first run starts."""
    trainer: str  # a key of TRAINERS
    script: Path  # the trainer's script, TRAINERS[trainer] when the plan was read (a job that schedules the runs after
    # a ladder's lr grid starts the same one)
    config: str
    seeds: list
    variants: list  # [Variant], the A/A control right after its baseline
    corpora: list  # [(name, trainer options)]: each a sweep of its own in OUT_DIR/{name}; [] for one sweep
    baseline: str
    control: str | None  # the A/A control's label
    ladder: Ladder | None
    size_options: dict  # {size: the trainer options of its shape and max_steps} ({None: []}: the config's size)
    lr_ratios: dict  # {trainer option an lr sets: its value over the lr}, from the trainer's own swept_lr
    resources: Resources
    nproc_per_node: int
    overrides: list  # trainer options after the sweep's own, for every run
    dry_run: bool = False
    throughput: list | None = None  # bench/train_step.py --json files for the cost line
    allow_edge_lr: bool = False  # run the ladder at a pick on the grid's edge instead of stopping

    @property
    def labels(self):
        return [variant.label for variant in self.variants]

    def lr_options(self, lr):
        """The trainer options that run an lr: ["--max-lr", "0.001", "--min-lr", "0.0001"]; [] for the config's."""
        if lr is None:
            return []
        return [item for name, ratio in self.lr_ratios.items() for item in (flag(name), f"{lr * ratio:g}")]


def flag(name):
    """A config option's command-line flag: max_lr -> --max-lr."""
    return f"--{name.replace('_', '-')}"


def run_dir(out_dir, label, seed, size=None, lr=None):
    return Path(out_dir) / "_".join([label, *([size] if size else []), *([f"lr{lr:g}"] if lr else []), f"seed{seed}"])


def options(table):
    """Trainer command-line options from a TOML table: {"plain_top_k": 1} -> ["--plain-top-k", "1"]."""
    out = []
    for key, value in table.items():
        text = json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
        out += [flag(key), text]
    return out


def trainer_config(trainer, argv):
    """The trainer's own TrainConfig from argv (--config FILE and options), read as the trainer reads it."""
    from training.config import load_config

    if trainer == "gpt2":  # torch with it: only a sweep that runs (never --status or --report-only) reads one
        from train_gpt2 import TrainConfig
    else:
        from train_translation import TrainConfig
    return load_config(TrainConfig, argv)


def read_file(path, lrs=None):
    """The PlanFile of a --plan TOML file (lrs: --lrs, which replaces the plan's)."""
    try:
        plan = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read --plan {path}: {e}") from None
    unknown = set(plan) - {*PLAN_KEYS, *PARAM_KEYS, *LADDER_KEYS}
    if unknown or not isinstance(plan.get("variants"), dict) or not plan["variants"]:
        raise ConfigError(f"--plan {path}: expected keys trainer, config, seeds, optional control, [variants.LABEL] "
                          f"tables and optional [corpora.NAME] tables{f'; unknown {sorted(unknown)}' if unknown else ''}")
    param = {k: plan[k] for k in PARAM_KEYS if k in plan}
    if param and "param" not in param:
        raise ConfigError(f"--plan {path}: {', '.join(param)} without param; name the parametrization (param = "
                          "\"completep\")")
    variants = []
    for label, table in plan["variants"].items():
        table = dict(table)
        baseline = table.pop("baseline", None)
        if baseline is not None and baseline not in plan["variants"]:
            raise ConfigError(f"--plan {path}: variant {label} has baseline {baseline!r}, which is not a variant")
        if param and (both := [k for k in PARAM_KEYS if k in table]):
            raise ConfigError(f"--plan {path}: variant {label} sets {', '.join(both)}, which the plan's param sets "
                              "for every variant; set it in one place")
        variants.append(Variant(label, options({**table, **param}), baseline))
    corpora = [(name, options(table)) for name, table in plan.get("corpora", {}).items()]
    control = plan.get("control", False)
    if not isinstance(control, (bool, str)):
        raise ConfigError(f"--plan {path}: control must be true or the control's label, got {control!r}")
    return PlanFile(plan.get("trainer"), plan.get("config"), plan.get("seeds"), variants, corpora, control,
                    read_ladder(plan, f"--plan {path}", lrs), plan.get("launcher"))


def read_ladder(plan, where, lrs=None):
    """The ladder of a plan's top-level table (lrs: --lrs, which replaces the plan's), or None without one."""
    lrs = lrs or plan.get("lrs")
    sizes = plan.get("sizes")
    if lrs is None and sizes is None:
        if "lr_size" in plan:
            raise ConfigError(f"{where}: lr_size needs [sizes.NAME] tables and lrs")
        return None
    if lrs is not None:
        if not isinstance(lrs, list) or not lrs or not all(isinstance(x, (int, float)) for x in lrs):
            raise ConfigError(f"{where}: lrs must be a list of numbers such as [1e-3, 2e-3, 4e-3], got {lrs!r}")
        if bad := [x for x in lrs if not x > 0]:
            raise ConfigError(f"{where}: learning rate {bad[0]} is not positive; an lr grid holds lrs > 0")
        lrs = sorted(float(x) for x in lrs)
        if len(lrs) > 1:
            check_grid("lrs", {lr: {} for lr in lrs})
    check_sizes(sizes, where)
    lr_size = plan.get("lr_size")
    if lr_size is not None and (lr_size not in (sizes or {}) or lrs is None or len(lrs) < 2):
        raise ConfigError(f"{where}: lr_size {lr_size!r} must name one of the [sizes.NAME] tables and needs lrs "
                          "(at least 2)")
    if plan.get("param") in TRANSFERRING and sizes and len(sizes) > 1 and lrs is not None and len(lrs) > 1:
        smallest = min(sizes, key=lambda name: size_compute(sizes[name]))
        if lr_size not in (None, smallest):
            raise ConfigError(f"{where}: param {plan['param']} transfers the lr across sizes, so its grid runs at the "
                              f"smallest size, {smallest}, not {lr_size!r}; leave lr_size out (the tuning audit checks "
                              "the pick at the largest)")
        lr_size = smallest
    lr_seeds = plan.get("lr_seeds")
    if lr_seeds is not None and (lr_size is None or not isinstance(lr_seeds, list) or not lr_seeds
                                 or not all(isinstance(s, int) for s in lr_seeds)
                                 or set(lr_seeds) & set(plan.get("seeds") or [])):
        raise ConfigError(f"{where}: lr_seeds must be a list of integers disjoint from seeds, with lr_size, "
                          f"got {lr_seeds!r}")
    largest = max(sizes, key=lambda name: size_compute(sizes[name])) if lr_seeds else None
    design = plan.get("lr_design", "smallest")
    rerun = plan.get("rerun_refuted", False)
    if not isinstance(rerun, bool) or (rerun and (not lr_seeds or largest == lr_size or design == "ends")):
        raise ConfigError(f"{where}: rerun_refuted = true re-runs an arm at its tuning audit's optimum, so it needs "
                          "the audit (lr_seeds, sizes above lr_size, lr_design smallest or horizon)")
    audit_seeds = plan.get("audit_seeds", AUDIT_SEEDS)
    if "audit_seeds" in plan and (not lr_seeds or type(audit_seeds) is not int
                                  or not 1 <= audit_seeds <= len(lr_seeds) or largest == lr_size or design == "ends"):
        raise ConfigError(f"{where}: audit_seeds = {audit_seeds!r}: the tuning audit's seeds, the first of lr_seeds, "
                          f"so an integer from 1 to {len(lr_seeds or [])} (the lr seeds), with sizes above lr_size "
                          "and lr_design smallest or horizon")
    if design == "smallest":
        return Ladder(lrs or [None], sizes or {None: {}}, lr_size, lr_seeds, largest if largest != lr_size else None,
                      rerun_refuted=rerun, audit_seeds=audit_seeds)
    if design not in DESIGNS or not lr_seeds or largest == lr_size or (
            design == "horizon" and plan.get("param") not in TRANSFERRING):
        raise ConfigError(f"{where}: lr_design {design!r} must be one of {', '.join(DESIGNS)} and needs lr_seeds, "
                          "two sizes or more and lrs" + (f", and a param that transfers the lr across shapes "
                                                         f"({', '.join(TRANSFERRING)})" if design == "horizon" else ""))
    # the horizon design grids the base shape at the largest size's steps too; the ends design the largest itself
    far = f"{lr_size}_T{largest}" if design == "horizon" else largest
    grid_sizes = {lr_size: sizes[lr_size], far: {**sizes[lr_size], "max_steps": sizes[largest]["max_steps"]}
                  if design == "horizon" else sizes[largest]}
    return Ladder(lrs, sizes, lr_size, lr_seeds, largest if design == "horizon" else None, design, grid_sizes, rerun,
                  audit_seeds)


def lr_at(ladder, picks, size):
    """An arm's lr at a size of a ladder whose grids ran at several horizons (design horizon or ends): picks {grid
    size: its pick (stats/lr_grid.py)}, each grid's vertex (its best lr at an edge) as a power of the horizon through
    them (log lr linear in log steps: Bjorck et al. 2024), read at the size's steps."""
    steps = [ladder.grid_sizes[name]["max_steps"] for name in picks]
    vertex = [p["interpolated_lr"] or p["best_lr"] for p in picks.values()]
    return power_of_horizon(steps, vertex, ladder.sizes[size]["max_steps"])


def power_of_horizon(steps, lrs, at):
    """The lr at `at` steps of the power of the horizon through (steps, lrs) (log lr linear in log steps, least
    squares through more than two), to 3 significant digits."""
    slope, intercept = np.polyfit(np.log(steps), np.log(lrs), 1)
    return float(f"{math.exp(intercept + slope * math.log(at)):.3g}")


def size_compute(table):
    """A size's compute, up to a constant: its blocks' parameters (12 n_layer n_embd^2) times its tokens."""
    return table["n_layer"] * table["n_embd"] ** 2 * table["max_steps"]


def check_sizes(sizes, where):
    if sizes is not None and (not isinstance(sizes, dict) or not sizes):
        raise ConfigError(f"{where}: sizes are [sizes.NAME] tables with {', '.join(SIZE_KEYS)}")
    for name, table in (sizes or {}).items():
        if unknown := sorted(set(table) - set(SIZE_KEYS) - set(SIZE_RUN_KEYS)):
            raise ConfigError(f"{where}: size {name} has unknown key(s) {unknown}; a size takes {', '.join(SIZE_KEYS)} "
                              f"and optionally {', '.join(SIZE_RUN_KEYS)}")
        if missing := [k for k in SHAPE_KEYS if k not in table]:
            raise ConfigError(f"{where}: size {name} lacks {', '.join(missing)}")
        if "max_steps" not in table:
            raise ConfigError(f"{where}: size {name} has no max_steps; give each size its budget (e.g. a fixed number "
                              "of tokens per parameter, as configs/ladder_cpu.toml does)")


def lr_ratios(ladder, trainer, config):
    """{trainer option an lr sets: its value over the lr}: the trainer's swept_lr, read off its config ({} without
    lrs)."""
    if ladder is None or None in ladder.lrs:
        return {}
    optim = trainer_config(trainer, ["--config", config]).optim
    lr, *scaled = optim.swept_lr
    if not getattr(optim, lr) > 0:
        raise ConfigError(f"{config}: an lr grid scales {', '.join(scaled) or 'nothing'} with {lr}; its {lr} "
                          f"{getattr(optim, lr)} must be positive")
    return {lr: 1.0, **{name: getattr(optim, name) / getattr(optim, lr) for name in scaled}}


def size_options(ladder, trainer):
    """{size: its trainer options} of a ladder."""
    if trainer == "translation" and None not in ladder.sizes:
        raise ConfigError("sizes are GPT-2 shapes (n_layer, n_embd, n_head); the translation trainer's ladder is lrs "
                          "alone")
    return {name: [o for k in (*SIZE_KEYS, *SIZE_RUN_KEYS) if k in table for o in (flag(k), str(table[k]))]
            if name else [] for name, table in {**ladder.sizes, **(ladder.grid_sizes or {})}.items()}


def from_args(args, overrides):
    """The Plan of the sweep's command line (argparse's namespace and the options it did not know); a plan that
    cannot run is a ConfigError."""
    file = read_file(args.plan, args.lrs) if args.plan else None
    if file and (args.acts or args.baseline):
        raise ConfigError("--plan names the variants and their baselines; leave out --acts and --baseline")
    if file:
        variants, corpora, ladder = file.variants, file.corpora, file.ladder
        trainer, config, seeds = args.trainer or file.trainer, args.config or file.config, args.seeds or file.seeds
        control = args.control or file.control
    else:
        variants = [Variant(a, ["--act", a], None) for a in args.acts or []]
        ladder = read_ladder({"lrs": args.lrs}, "--lrs") if args.acts and args.lrs else None
        trainer, config, seeds, corpora, control = args.trainer, args.config, args.seeds, [], args.control
    trainer = trainer or "gpt2"
    missing = (["--acts (or --plan)"] if not variants else []) + [
        name for name, value in (("--config", config), ("--seeds", seeds), ("--out-dir", args.out_dir)) if not value]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (or use --report-only DIR)")
    if trainer not in TRAINERS:
        raise ConfigError(f"unknown trainer {trainer!r}; choose one of {', '.join(sorted(TRAINERS))}")
    check_options(variants, corpora, overrides)
    ratios, sizes = {}, {}
    if ladder:
        sizes, ratios = size_options(ladder, trainer), lr_ratios(ladder, trainer, config)
        fixed = {*map(flag, SIZE_KEYS if None not in ladder.sizes else ()), *map(flag, ratios)}
        if clash := [o for o in overrides + [o for _, opts in corpora for o in opts[::2]] +
                     [o for _, opts, _ in variants for o in opts[::2]] if o.split("=")[0].replace("_", "-") in fixed]:
            raise ConfigError(f"{', '.join(clash)} is set by the ladder (sizes, lrs) for each run; remove it from the "
                              "options")
    check_names(variants, corpora, args.baseline, args.nproc_per_node)
    check_overridden(variants, corpora, overrides)
    devices = check_runs(trainer, config, variants, corpora, sizes or {None: []}, overrides)
    resources = read_resources(file.launcher if file else None, f"--plan {args.plan}" if args.plan else "--launcher",
                               args.launcher)
    if resources.gpus_per_node is None and devices == {"cpu"}:  # a CPU config asks the scheduler for no GPU
        resources = replace(resources, gpus_per_node=0)
    baseline = args.baseline or variants[0].label
    variants, control = with_control(variants, baseline, control)
    return Plan(trainer, TRAINERS[trainer], config, seeds, variants, corpora, baseline, control, ladder, sizes, ratios,
                resources, args.nproc_per_node, overrides, args.dry_run, args.throughput, args.allow_edge_lr)


def check_options(variants, corpora, overrides):
    """The options the sweep sets for each run are its own: no variant, corpus or override may set them."""
    clash = [o.split("=")[0] for o in overrides if o.split("=")[0] in RESERVED]
    clash += [o for _, opts in corpora for o in opts[::2] if o in RESERVED or o == "--act"]
    clash += [o for _, opts, _ in variants for o in opts[::2] if o in RESERVED - {"--act"}]
    if clash:
        raise ConfigError(f"{', '.join(clash)} is set by the sweep for each run; remove it from the trainer options")


def option_names(options):
    """The flags of trainer options (["--data_dir", "x", "--lr=1"] -> ["--data-dir", "--lr"])."""
    return [o.split("=")[0].replace("_", "-") for o in options if o.startswith("--")]


def check_overridden(variants, corpora, overrides):
    """An option set twice for a run would be taken from the later place without a word: the command line's over a
    corpus's or a variant's own, a corpus's over a variant's. Refused, naming both."""
    corpus_sources = [(f"corpus {name}", opts) for name, opts in corpora]
    pairs = [(f"variant {label}", opts, [*corpus_sources, ("the command line", overrides)])
             for label, opts, _ in variants]
    pairs += [(owner, opts, [("the command line", overrides)]) for owner, opts in corpus_sources]
    for owner, opts, later in pairs:
        for source, over in later:
            if both := sorted(set(option_names(opts)) & set(option_names(over))):
                raise ConfigError(f"{', '.join(both)} on {source} would override {owner}'s own; set it in one place")


WIDTH = {"gpt2": "n_embd", "translation": "d_model"}  # the model width its n_head must divide


def check_runs(trainer, config, variants, corpora, sizes, overrides):
    """Every run's trainer config, read as its trainer will read it, before anything is submitted or run: options
    it knows, a width its heads divide. Returns the devices the runs ask for."""
    devices = set()
    for corpus, corpus_options in corpora or [(None, [])]:
        for label, options, _ in variants:
            for size, shape in sizes.items():
                where = " ".join(filter(None, [f"variant {label}", size and f"size {size}",
                                               corpus and f"corpus {corpus}"]))
                try:
                    model = trainer_config(trainer, ["--config", config, *options, *shape, *corpus_options,
                                                     *overrides])
                except ConfigError as e:
                    raise ConfigError(f"{where}: {plan_source(e, trainer, [config, *options, *shape])}") from None
                if trainer == "gpt2":  # a parametrization it knows, with the base it scales from
                    from model_parts.parametrization import Parametrization

                    try:
                        Parametrization.of(model.model)
                    except ConfigError as e:
                        raise ConfigError(f"{where}: {e}") from None
                width = getattr(model.model, WIDTH[trainer])
                if width % model.model.n_head:
                    raise ConfigError(f"{where}: n_head {model.model.n_head} does not divide {WIDTH[trainer]} {width}: "
                                      "change n_head (or the width) in the plan")
                devices.add(model.run.device)
    return devices


def plan_source(error, trainer, plan_argv):
    """The trainer's error about its options, which it says came from "the command line": "the plan" when the
    plan's own options (config, variant, size) make it."""
    if "the command line" not in str(error):
        return str(error)
    try:
        trainer_config(trainer, ["--config", *plan_argv])
    except ConfigError:
        return str(error).replace("in the command line", "in the plan")
    return str(error)


def check_names(variants, corpora, baseline, nproc_per_node):
    """Labels that name directories, activations the registry knows, a baseline among the variants."""
    import activations  # torch with it: only a sweep that runs (never --status or --report-only) checks names

    if bad := [name for name, *_ in variants + corpora if not LABEL.fullmatch(name)]:
        raise ConfigError(f"variant/corpus names {', '.join(bad)} must be letters, digits, . _ + - (they name "
                          "directories)")
    acts = [opts[opts.index("--act") + 1] for _, opts, _ in variants if "--act" in opts]
    if unknown := [a for a in acts if a not in activations.available() and activations.gate_activation(a) is None]:
        raise ConfigError(f"unknown activation(s) {', '.join(unknown)}; choose from "
                          f"{', '.join(activations.available())}, or a gated MLP: {', '.join(activations.GLU_NAMES)} "
                          f"or NAME{activations.GLU_SUFFIX}")
    labels = [label for label, _, _ in variants]
    if baseline and baseline not in labels:
        raise ConfigError(f"--baseline {baseline} is not one of --acts {','.join(labels)}")
    if nproc_per_node < 1:
        raise ConfigError("--nproc-per-node must be at least 1")


def with_control(variants, baseline, control):
    """(variants, the control's label or None): with an A/A control (control true or its label), the baseline
    again right after it, with the same seeds and another init stream (the trainer's --init-seed-offset)."""
    if not control:
        return variants, None
    labels = [label for label, _, _ in variants]
    label = control if isinstance(control, str) else f"{baseline}_aa"
    if label in labels or not LABEL.fullmatch(label):
        raise ConfigError(f"control label {label!r} must be new and made of letters, digits, . _ + -")
    base_options = next(opts for name, opts, _ in variants if name == baseline)
    at = labels.index(baseline) + 1
    return [*variants[:at], Variant(label, [*base_options, "--init-seed-offset", str(CONTROL_INIT_SEED_OFFSET)],
                                     baseline), *variants[at:]], label


def grid_pick(label, grid_dirs):
    """stats/lr_grid.py's pick of one arm (its best lr, its edge), from its finished grid runs {lr: {seed: dir}}."""
    grid = {}
    for lr, seeds in grid_dirs.items():
        for seed, path in seeds.items():
            try:
                loss = summary(load_run(path))["final_val"]
            except RunError as e:
                raise ConfigError(f"the lr grid's run {path} cannot be read ({e}); rerun the sweep") from None
            grid.setdefault(lr, {})[seed] = math.inf if loss is None else loss
    return pick(label, grid)
