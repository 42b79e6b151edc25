"""Which arm a run belongs to: one rule for the sweep report and the ladder report alike, read from the runs' own
run.json (never from directory names, so runs made by hand or on other machines read alike). A run's arm is the
plan's variant whose every option the run's config holds (the most specific one: gelu_cp's act gelu and param
completep over gelu_sp's act gelu); else (no plan, or no variant matches) its activation, with the model options
besides the shape and the data's that differ between the runs named in the label (gelu+norm=rmsnorm), and the
init seed offset of an A/A control. A run without a config (another harness's log.txt) is its directory's name
less `_seedN`."""
import re
import json

SHAPE = ("n_layer", "n_embd", "n_head")
NOT_ARM = (*SHAPE, "block_size", "vocab_size")  # the model options that are the size's or the data's, not the arm's


def _text(value):
    """An option's value in an arm label: rmsnorm, 1000000, {"impl":"torch"}."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


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


def identity(run):
    """The model options of a run that are its arm's (not its size's or its data's), and an A/A control's offset."""
    out = {k: v for k, v in ((run.config or {}).get("model") or {}).items() if k not in NOT_ARM}
    if offset := run.setting("init_seed_offset"):  # an A/A control: the baseline's options, another init
        out["init_seed_offset"] = offset
    return out


def arms_of(runs, variants):
    """Each run's arm label (the module's rule), in the order of runs; variants: the plan's {label: options}."""
    identities = [identity(run) for run in runs]
    varying = [k for k in dict.fromkeys(k for i in identities for k in i)
               if k != "act" and len({json.dumps(i.get(k), sort_keys=True) for i in identities}) > 1]
    return [variant_of(run, variants) or (str(i.get("act")) + "".join(f"+{k}={_text(i[k])}" for k in varying if k in i)
                                           if run.config else re.sub(r"_seed\d+$", "", run.path.name))
            for run, i in zip(runs, identities)]
