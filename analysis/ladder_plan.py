"""A ladder plan: the model sizes and learning rates a sweep crosses with its arms and seeds.

Beside trainer, config, seeds and [variants.LABEL], a --plan TOML file may name:

    lrs = [1e-3, 2e-3, 4e-3]   # every arm at every lr, log-spaced (or `python -m analysis.sweep --lrs 1e-3,2e-3,4e-3`)
    lr_size = "s2"             # optional: the grid at this size only; the other sizes then run each arm at the best
                               # lr the grid picked for it (stats/lr_grid.py's rule), after the whole grid
    lr_seeds = [11, 12]        # optional: the grid on these seeds, disjoint from `seeds`; then every size, lr_size
                               # too, runs each arm at its picked lr on `seeds`: the lr is chosen on other runs than
                               # the ones compared, so the choice's luck (a winner's curse) cannot favour an arm
    [sizes.s1]                 # a model size (GPT-2 trainer): n_layer, n_embd, n_head and its budget, max_steps
    n_layer = 2
    n_embd = 64
    n_head = 2
    max_steps = 400

Runs: arms x sizes x seeds (x lrs). An lr sets the GPT trainer's max_lr and scales its min_lr with it (the config's
min_lr / max_lr ratio kept: the cosine schedule keeps its shape), or the translation trainer's lr (inverse square
root: its whole schedule scales). Each size states its own max_steps, the same for every arm (the same data). The
rule behind a ladder's budgets is the plan's to state and a test's to check: the shipped plans give every size a
fixed number of tokens per parameter outside the embeddings (tests/test_ladder.py recomputes them from model.py).
The sweep builds models only to count a plan's FLOPs for its cost line (analysis/cost.py).
"""
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from stats.lr_grid import check_grid, pick
from analysis.runs import RunError, leaf, load_run, summary
from errors import ConfigError

SHAPE_KEYS = ("n_layer", "n_embd", "n_head")
SIZE_KEYS = (*SHAPE_KEYS, "max_steps")
KEYS = ("lrs", "lr_size", "lr_seeds", "sizes")
# what the ladder sets for each run, per trainer: the plan's variants and the options after it must leave them alone
SET_BY_SIZES = ("--n-layer", "--n-embd", "--n-head", "--max-steps")
SET_BY_LRS = {"gpt2": ("--max-lr", "--min-lr"), "translation": ("--lr",)}


@dataclass
class Ladder:
    lrs: list  # [None]: the config's lr
    sizes: dict  # name -> its table; {None: {}}: the config's size
    lr_size: str | None
    lr_seeds: list | None = None  # the grid's own seeds (None: the sweep's seeds, the choice then made on them)

    def fixed_options(self, trainer):
        """The trainer options the ladder sets for each run."""
        return (SET_BY_SIZES if None not in self.sizes else ()) + (SET_BY_LRS[trainer] if None not in self.lrs else ())


def read(plan, where, lrs=None):
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
    if sizes is not None and (not isinstance(sizes, dict) or not sizes):
        raise ConfigError(f"{where}: sizes are [sizes.NAME] tables with {', '.join(SIZE_KEYS)}")
    for name, table in (sizes or {}).items():
        if unknown := sorted(set(table) - set(SIZE_KEYS)):
            raise ConfigError(f"{where}: size {name} has unknown key(s) {unknown}; a size takes {', '.join(SIZE_KEYS)}")
        if missing := [k for k in SHAPE_KEYS if k not in table]:
            raise ConfigError(f"{where}: size {name} lacks {', '.join(missing)}")
        if "max_steps" not in table:
            raise ConfigError(f"{where}: size {name} has no max_steps; give each size its budget (e.g. a fixed number "
                              "of tokens per parameter, as configs/ladder_cpu.toml does)")
    lr_size = plan.get("lr_size")
    if lr_size is not None and (lr_size not in (sizes or {}) or lrs is None or len(lrs) < 2):
        raise ConfigError(f"{where}: lr_size {lr_size!r} must name one of the [sizes.NAME] tables and needs lrs "
                          "(at least 2)")
    lr_seeds = plan.get("lr_seeds")
    if lr_seeds is not None and (lr_size is None or not isinstance(lr_seeds, list) or not lr_seeds
                                 or not all(isinstance(s, int) for s in lr_seeds)
                                 or set(lr_seeds) & set(plan.get("seeds") or [])):
        raise ConfigError(f"{where}: lr_seeds must be a list of integers disjoint from seeds, with lr_size, "
                          f"got {lr_seeds!r}")
    return Ladder(lrs or [None], sizes or {None: {}}, lr_size, lr_seeds)


def check(ladder, trainer, config):
    """({size: its trainer options}, the config's min_lr / max_lr ratio: what an lr scales; None for translation)."""
    if trainer == "translation" and None not in ladder.sizes:
        raise ConfigError("sizes are GPT-2 shapes (n_layer, n_embd, n_head); the translation trainer's ladder is lrs "
                          "alone")
    options = {name: [o for k in SIZE_KEYS for o in (f"--{k.replace('_', '-')}", str(table[k]))] if name else []
               for name, table in ladder.sizes.items()}
    if trainer == "translation" or None in ladder.lrs:
        return options, None
    try:
        table = tomllib.loads(Path(config).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config {config}: {e}") from None
    max_lr, min_lr = leaf(table, "max_lr"), leaf(table, "min_lr")
    if not (isinstance(max_lr, (int, float)) and isinstance(min_lr, (int, float)) and max_lr > 0):
        raise ConfigError(f"{config}: an lr grid scales min_lr with max_lr (their ratio kept); set both in its [optim]")
    return options, min_lr / max_lr


def lr_options(trainer, lr, ratio):
    if lr is None:
        return []
    return ["--lr", f"{lr:g}"] if trainer == "translation" else ["--max-lr", f"{lr:g}", "--min-lr", f"{lr * ratio:g}"]


def best_lr(label, grid_dirs):
    """The grid's best lr of one arm by stats/lr_grid.py's rule, from its finished runs {lr: {seed: dir}}."""
    grid = {}
    for lr, seeds in grid_dirs.items():
        for seed, path in seeds.items():
            try:
                loss = summary(load_run(path))["final_val"]
            except RunError as e:
                raise ConfigError(f"the lr grid's run {path} cannot be read ({e}); rerun the sweep") from None
            grid.setdefault(lr, {})[seed] = math.inf if loss is None else loss
    return pick(label, grid)["best_lr"]
