"""A ladder plan: the model sizes and learning rates a sweep crosses with its arms and seeds.

Beside trainer, config, seeds and [variants.LABEL], a --plan TOML file may name:

    lrs = [1e-3, 2e-3, 4e-3]   # every arm at every lr, log-spaced (or `python -m analysis.sweep --lrs 1e-3,2e-3,4e-3`)
    lr_size = "s2"             # optional: the grid at this size only; the other sizes then run each arm at the best
                               # lr the grid picked for it (analysis/lr_grid.py's rule), after the whole grid
    tokens_per_param = 20      # the budget of every size: max_steps = ceil(20 N / tokens per step), N the size's
                               # parameters outside the embeddings
    [sizes.s1]                 # a model size: n_layer, n_embd, n_head, and max_steps unless tokens_per_param is set
    n_layer = 2
    n_embd = 64
    n_head = 2

Runs: arms x sizes x seeds (x lrs). An lr sets the GPT trainer's max_lr and scales its min_lr with it (the config's
min_lr / max_lr ratio kept: the cosine schedule keeps its shape), or the translation trainer's lr (inverse square
root: its whole schedule scales). The budget rule counts N with the config's own activation at each size, so every
arm at a size trains the same steps on the same data (a gated arm is parameter-matched: activations/gated.py).
"""
import math
from dataclasses import dataclass, replace

import torch

from analysis.lr_grid import check_grid, pick
from analysis.runs import RunError, load_run, summary
from errors import ConfigError

SHAPE_KEYS = ("n_layer", "n_embd", "n_head")
SIZE_KEYS = (*SHAPE_KEYS, "max_steps")
KEYS = ("lrs", "lr_size", "tokens_per_param", "sizes")
# what the ladder sets for each run, per trainer: the plan's variants and the options after it must leave them alone
SET_BY_SIZES = ("--n-layer", "--n-embd", "--n-head", "--max-steps")
SET_BY_LRS = {"gpt2": ("--max-lr", "--min-lr"), "translation": ("--lr",)}


@dataclass
class Ladder:
    lrs: list  # [None]: the config's lr
    sizes: dict  # name -> its table; {None: {}}: the config's size
    tokens_per_param: float | None
    lr_size: str | None

    def fixed_options(self, trainer):
        """The trainer options the ladder sets for each run."""
        return (SET_BY_SIZES if None not in self.sizes else ()) + (SET_BY_LRS[trainer] if None not in self.lrs else ())


def read(plan, where, lrs=None):
    """The ladder of a plan's top-level table (lrs: --lrs, which replaces the plan's), or None without one."""
    lrs = lrs or plan.get("lrs")
    sizes = plan.get("sizes")
    if lrs is None and sizes is None:
        for key in ("lr_size", "tokens_per_param"):
            if key in plan:
                raise ConfigError(f"{where}: {key} needs [sizes.NAME] tables")
        return None
    if lrs is not None:
        if not isinstance(lrs, list) or not lrs or not all(isinstance(x, (int, float)) for x in lrs):
            raise ConfigError(f"{where}: lrs must be a list of numbers such as [1e-3, 2e-3, 4e-3], got {lrs!r}")
        if bad := [x for x in lrs if not x > 0]:
            raise ConfigError(f"{where}: learning rate {bad[0]} is not positive; an lr grid holds lrs > 0")
        lrs = sorted(float(x) for x in lrs)
        if len(lrs) > 1:
            check_grid("lrs", {lr: {} for lr in lrs})
    per_param = plan.get("tokens_per_param")
    if per_param is not None and not (isinstance(per_param, (int, float)) and per_param > 0):
        raise ConfigError(f"{where}: tokens_per_param must be a positive number, got {per_param!r}")
    if sizes is not None and (not isinstance(sizes, dict) or not sizes):
        raise ConfigError(f"{where}: sizes are [sizes.NAME] tables with {', '.join(SIZE_KEYS)}")
    for name, table in (sizes or {}).items():
        if unknown := sorted(set(table) - set(SIZE_KEYS)):
            raise ConfigError(f"{where}: size {name} has unknown key(s) {unknown}; a size takes {', '.join(SIZE_KEYS)}")
        if missing := [k for k in SHAPE_KEYS if k not in table]:
            raise ConfigError(f"{where}: size {name} lacks {', '.join(missing)}")
        if ("max_steps" in table) == (per_param is not None):
            raise ConfigError(f"{where}: size {name} {'has max_steps and' if per_param else 'has no max_steps, nor'} "
                              f"the plan {'has ' if per_param else ''}tokens_per_param; give each size its max_steps "
                              "or the plan one tokens_per_param, not both")
    lr_size = plan.get("lr_size")
    if lr_size is not None and (lr_size not in (sizes or {}) or lrs is None or len(lrs) < 2):
        raise ConfigError(f"{where}: lr_size {lr_size!r} must name one of the [sizes.NAME] tables and needs lrs "
                          "(at least 2)")
    return Ladder(lrs or [None], sizes or {None: {}}, per_param, lr_size)


def check(ladder, trainer, config, overrides):
    """{size: its trainer options} and the config's min_lr / max_lr ratio, from the config as the trainer loads it."""
    if trainer == "translation":
        if None not in ladder.sizes:
            raise ConfigError("sizes are GPT-2 shapes (n_layer, n_embd, n_head); the translation trainer's ladder "
                              "is lrs alone")
        return {None: []}, None
    from train_gpt2 import TrainConfig  # the trainer's own defaults, config file and options: what a run will use
    from training.config import load_config
    cfg = load_config(TrainConfig, ["--config", config, *overrides])
    options = {}
    for name, table in ladder.sizes.items():
        if name is None:
            return {None: []}, cfg.optim.min_lr / cfg.optim.max_lr
        steps = table.get("max_steps")
        if steps is None:
            shape = replace(cfg.model, **{k: table[k] for k in SHAPE_KEYS})
            steps = math.ceil(ladder.tokens_per_param * non_embedding(shape) / cfg.optim.total_batch_size)
        options[name] = [o for k in SHAPE_KEYS for o in (f"--{k.replace('_', '-')}", str(table[k]))]
        options[name] += ["--max-steps", str(steps)]
    return options, cfg.optim.min_lr / cfg.optim.max_lr


def non_embedding(model_config):
    """Parameters outside the token and position embeddings of a GPT of this config (built on the meta device)."""
    from model import GPT
    with torch.device("meta"):
        return GPT(model_config).param_counts()["non_embedding"]


def lr_options(trainer, lr, ratio):
    if lr is None:
        return []
    return ["--lr", f"{lr:g}"] if trainer == "translation" else ["--max-lr", f"{lr:g}", "--min-lr", f"{lr * ratio:g}"]


def best_lr(label, grid_dirs):
    """The grid's best lr of one arm by analysis/lr_grid.py's rule, from its finished runs {lr: {seed: dir}}."""
    grid = {}
    for lr, seeds in grid_dirs.items():
        for seed, path in seeds.items():
            try:
                loss = summary(load_run(path))["final_val"]
            except RunError as e:
                raise ConfigError(f"the lr grid's run {path} cannot be read ({e}); rerun the sweep") from None
            grid.setdefault(lr, {})[seed] = math.inf if loss is None else loss
    return pick(label, grid)["best_lr"]
