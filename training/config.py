"""Typed configuration: dataclasses + TOML files in configs/ + command-line overrides.

One mechanism for both trainers. A config is a (possibly nested) dataclass; a TOML file sets any
field (nested dataclasses are TOML tables), and the command line overrides any leaf field by its
name: `--max-steps 50`, `--max_steps=50`, `--act aglu` or the dotted path `--model.act aglu`.
Leaf names are unique across a config's sections, so the short form is never ambiguous.
Unknown keys and values that do not parse are one-line errors that name the valid choices.
"""
import ast
import dataclasses
import difflib
import functools
import inspect
import json
import textwrap
import tomllib
import types
import typing
from pathlib import Path

from errors import ConfigError, NanoactError


def _leaves(cls, prefix=""):
    """Map every leaf field's dotted path to its (type, owning path)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_leaves(hints[f.name], path + "."))
        else:
            out[path] = hints[f.name]
    return out


def _suggest(key, choices):
    close = difflib.get_close_matches(key, choices, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else f"; valid keys: {', '.join(sorted(choices))}"


def _coerce(value, tp, key):
    """Convert a TOML value or a command-line string to the field's declared type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _coerce(value, args[0], key)
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, str):
                number = float(value)  # accepts 1e8 and 524288
                if number != int(number):
                    raise ValueError
                return int(number)
            if isinstance(value, float) and value != int(value):
                raise ValueError
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
        if origin is tuple:
            items = json.loads(f"[{value}]") if isinstance(value, str) else list(value)
            inner = typing.get_args(tp)
            return tuple(_coerce(v, inner[0] if inner[-1] is Ellipsis else inner[i], key) for i, v in enumerate(items))
        if tp is dict or origin is dict:
            parsed = json.loads(value) if isinstance(value, str) else value
            if not isinstance(parsed, dict):
                raise ValueError
            return dict(parsed)
    except (ValueError, TypeError, json.JSONDecodeError):
        pass
    else:
        raise ConfigError(f"config key {key!r} has unsupported type {tp}")
    hint = " (a JSON object, e.g. '{\"kappa_init\": [1.0, 1.3]}')" if tp is dict or origin is dict else ""
    raise ConfigError(f"config key {key!r}: cannot read {value!r} as {getattr(tp, '__name__', tp)}{hint}")


def _is_bool(tp):
    return tp is bool or (typing.get_origin(tp) in (typing.Union, types.UnionType) and bool in typing.get_args(tp))


def _set(cfg, path, value):
    *parents, name = path.split(".")
    for p in parents:
        cfg = getattr(cfg, p)
    setattr(cfg, name, value)


def _flatten_toml(table, prefix=""):
    for key, value in table.items():
        if isinstance(value, dict) and not key.endswith("kwargs"):
            yield from _flatten_toml(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _resolve(key, leaves, source):
    """A dotted path, or a unique leaf name, -> the dotted path."""
    key = key.replace("-", "_")
    if key in leaves:
        return key
    matches = [p for p in leaves if p.rsplit(".", 1)[-1] == key]
    if len(matches) == 1:
        return matches[0]
    short = sorted({p.rsplit(".", 1)[-1] for p in leaves})
    raise ConfigError(f"unknown config key {key!r} in {source}{_suggest(key, short)}")


def load_config(cls, argv=None):
    """Build `cls` from its defaults, then `--config FILE.toml`, then `--key value` overrides."""
    argv = list(argv or [])
    leaves = _leaves(cls)
    cfg = cls()
    if "--config" in argv or any(a.startswith("--config=") for a in argv):
        i = next(i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config="))
        path = argv[i].split("=", 1)[1] if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else "")
        del argv[i:i + (1 if "=" in argv[i] else 2)]
        if not path or not Path(path).is_file():
            raise ConfigError(f"config file {path!r} not found; the ones shipped are in configs/")
        with open(path, "rb") as f:
            try:
                table = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path}: not valid TOML ({e})") from None
        for key, value in _flatten_toml(table):
            full = _resolve(key, leaves, path)
            _set(cfg, full, _coerce(value, leaves[full], full))
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; options are --key value (see --help)")
        key, value = (arg[2:].split("=", 1) + [None])[:2]
        if value is None and key.startswith("no-") or value is None and key.startswith("no_"):
            full = _resolve(key[3:], leaves, "the command line")
            if _is_bool(leaves[full]):
                _set(cfg, full, False)
                i += 1
                continue
        full = _resolve(key, leaves, "the command line")
        if value is None:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if _is_bool(leaves[full]) and (nxt is None or nxt.startswith("--")):
                value, i = True, i + 1
            elif nxt is None:
                raise ConfigError(f"--{key} needs a value")
            else:
                value, i = nxt, i + 2
        else:
            i += 1
        _set(cfg, full, _coerce(value, leaves[full], full))
    return cfg


def learning_rate(cfg):
    """The run's learning rate, as a sweep sets it and run.json states it: the first option its optim section's
    `swept_lr` names (the GPT trainer's max_lr, the translation trainer's lr); None for a trainer that names none
    (a new trainer runs without it; a sweep cannot set its lr)."""
    swept = getattr(cfg.optim, "swept_lr", ())
    return getattr(cfg.optim, swept[0]) if swept else None


def to_dict(cfg):
    """A config (or any part of it) as plain data: what checkpoints, run.json and resume comparisons store."""
    return dataclasses.asdict(cfg)


def result_changes(cfg, stored):
    """{dotted path: (stored value, cfg's value)} of the options that differ from `stored` (to_dict of the config a
    checkpoint was made with) and that the run's result depends on: every option but those its section (dataclass)
    lists in `resume_may_change`. An option added since the checkpoint was written compares at its default, what
    the code that wrote it did."""
    changes = {}

    def walk(section, old, default, prefix):
        for f in dataclasses.fields(section):
            if f.name in getattr(type(section), "resume_may_change", ()):
                continue
            value, default_value = getattr(section, f.name), getattr(default, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, old.get(f.name) or {}, default_value, f"{prefix}{f.name}.")
                continue
            before = old.get(f.name, default_value)
            if json.dumps(before, sort_keys=True, default=str) != json.dumps(value, sort_keys=True, default=str):
                changes[prefix + f.name] = (before, value)

    walk(cfg, stored, type(cfg)(), "")
    return changes


def listed_changes(changes):
    """{path: (old, new)} as one line's `optim.max_lr 0.0006 -> 0.0003, ...`."""
    return ", ".join(f"{path} {old!r} -> {new!r}" for path, (old, new) in changes.items())


def option_paths(cls, names, source):
    """Comma-separated option names (a leaf's name or its dotted path, as on the command line) -> dotted paths."""
    leaves = _leaves(cls)
    return {_resolve(name.strip(), leaves, source) for name in names.split(",") if name.strip()}


def from_dict(cls, data):
    """Rebuild a config saved with to_dict (used when resuming and loading checkpoints)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if dataclasses.is_dataclass(hints[f.name]):
            value = from_dict(hints[f.name], value)
        elif typing.get_origin(hints[f.name]) is tuple or hints[f.name] is tuple:
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


@functools.cache  # read once per class, not per option: inspect.getsource parses the class's whole module
def _field_comments(klass):
    """{field: what its comment says} of one dataclass body: the comment after the field, else the comment lines
    just above it. The comments are the options' documentation, written once, beside the defaults."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # a class made at run time has no source
        return {}
    lines, out = source.splitlines(), {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            after = lines[node.end_lineno - 1][node.end_col_offset:].strip()
            above = []
            for line in reversed(lines[:node.lineno - 1]):
                if not line.strip().startswith("#"):
                    break
                above.insert(0, line.strip()[1:].strip())
            text = after[1:].strip() if after.startswith("#") else " ".join(above)
            if text:
                out[node.target.id] = text
    return out


def help_text(cls, defaults=None):
    """One line per option: its default and its comment in the dataclass (a subclass's comment wins), for --help."""
    defaults = defaults or cls()
    lines = []
    for path in _leaves(cls):
        value, owner = defaults, cls
        for part in path.split(".")[:-1]:
            value, owner = getattr(value, part), typing.get_type_hints(owner)[part]
        name = path.rsplit(".", 1)[-1]
        comments = {}
        for klass in reversed(owner.__mro__):
            if dataclasses.is_dataclass(klass):
                comments.update(_field_comments(klass))
        comment = f"  {comments[name]}" if name in comments else ""
        lines.append(f"  --{name.replace('_', '-'):28s} {getattr(value, name)!r:10s}{comment}".rstrip())
    return "\n".join(lines)


@dataclasses.dataclass
class RunConfig:
    """What every training run has, whatever the model: where it writes, how it runs, when it saves."""
    out_dir: str = "log"
    seed: int = 1337  # data order, and torch's RNG (init, dropout) with init_seed_offset
    # torch's RNG gets seed + init_seed_offset: another init stream over the same data order (a sweep's A/A control)
    init_seed_offset: int = 0
    device: str = "auto"  # auto: cuda, then mps, then cpu
    dtype: str = "auto"  # auto: bfloat16 autocast on CUDA, float32 elsewhere; or float32 / bfloat16
    compile: typing.Optional[bool] = None  # None: on for CUDA, off elsewhere
    compile_mode: str = "default"  # torch.compile mode: default, max-autotune-no-cudagraphs, max-autotune, reduce-overhead
    resume: bool = False  # continue from the newest checkpoint in out_dir; an error if there is none
    auto_resume: bool = False  # continue from the newest checkpoint if there is one, else start fresh (schedulers)
    log_interval: int = 1  # a stdout line every N steps (0: none)
    checkpoint_interval: int = 1000  # a checkpoint every N steps (0: only at the end and on a stop signal)
    keep_checkpoints: int = 3
    dist_timeout: float = 600.0  # seconds a collective may wait for the other ranks before the run stops naming them
    # several ranks: ddp (every rank holds the whole model), fsdp (parameters, gradients and optimizer state
    # sharded over the ranks: training/fsdp.py; docs/training.md says when) or hsdp (sharded within each node,
    # replicated across nodes); one process trains unsharded either way
    dist: str = "ddp"
    activation_checkpointing: bool = False  # recompute each block's activations in backward: memory for compute
    # the activation kernels' verdicts (activations/policy.py); "": $NANOACT_CACHE, else $XDG_CACHE_HOME/nanoact
    # or ~/.cache/nanoact
    kernel_cache: str = ""
    kernel_reprobe: bool = False  # probe the kernels again: ignore cached verdicts and the recorded decision
    # reuse the kernel decisions recorded in this run directory's run.json (a sweep gives later seeds the first's)
    kernels_from: typing.Optional[str] = None
    # the MLP with its activation in its matmuls' epilogues where the probe measures it faster on this GPU
    # (activations/fused_mlp.py); false keeps the unfused MLP everywhere
    fused_mlp: bool = True
    tensorboard: bool = False
    wandb_project: typing.Optional[str] = None  # also log to this Weights & Biases project (pip install wandb)
    wandb_run_name: typing.Optional[str] = None  # None: the out_dir's name
    # options this resume changes on purpose, e.g. max_steps,max_lr: printed, kept in run.json and metrics.jsonl;
    # a resume that changes any other option its result depends on is refused
    resume_changes: str = ""

    # What a resume may change without --resume-changes (training/checkpoint.py compares every other option of a
    # config with the checkpoint's, so a new option is checked unless listed here): where the files go and how the
    # run is logged, how often it saves, how long a collective waits, how fast it runs (torch.compile, its mode;
    # the translation loader refuses a resume whose batch padding, which compile picks by default, differs) and
    # how the kernels are chosen (a resume reuses its checkpoint's kernel decisions); activation checkpointing
    # recomputes the same operations. seed, device and dtype are not here: they choose the RNG streams and the
    # precision; nor is dist: FSDP's reductions sum in another order than DDP's (a change to declare).
    resume_may_change: typing.ClassVar[tuple] = (
        "out_dir", "compile", "compile_mode", "resume", "auto_resume", "log_interval", "checkpoint_interval",
        "keep_checkpoints", "dist_timeout", "activation_checkpointing", "kernel_cache", "kernel_reprobe",
        "kernels_from", "fused_mlp", "tensorboard", "wandb_project", "wandb_run_name", "resume_changes")

    @property
    def init_seed(self):
        """The initial weights' seed (the models' constructors take it) and torch's RNG's (dropout)."""
        return self.seed + self.init_seed_offset


@dataclasses.dataclass
class EvalConfig:
    """The evaluation section both trainers share; each trainer extends it with its own evaluations."""
    eval_interval: int = 250  # validation loss (and the trainer's evaluations) every N steps (0: never) and at the end

    # when evaluations run, not what they measure: the weights never depend on it, and every evaluation of the run
    # measures the same thing (what they measure, e.g. val_tokens, is checked: a best val loss over two validation
    # sets means nothing)
    resume_may_change: typing.ClassVar[tuple] = ("eval_interval",)


def run_cli(doc, cls, argv, run):
    """A trainer's command line: --help lists every option; otherwise build `cls` (defaults, --config TOML,
    --key value) and call run(cfg). The project's own errors (errors.py: config, checkpoint, data, tokenizer,
    distributed) end in one line; any other exception keeps its traceback."""
    if "-h" in argv or "--help" in argv:
        print(doc + "\noptions (default):\n" + help_text(cls))
        return None
    try:
        return run(load_config(cls, argv))
    except NanoactError as e:
        raise SystemExit(f"error: {e}") from None
