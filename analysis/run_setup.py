"""What can change a result besides the config, compared across runs and across the starts of each run.

Runs of one comparison should differ only in what is compared. run.json records, per start of a run (its
`segments`: the first start, then every resume or torchrun restart), the precision `auto` chose (float16 on a GPU
without bf16), compile and its mode, world size x gradient accumulation, the torch/Triton/CUDA versions, the GPU,
the code (commit, and a dirty tree's diff) and the activation kernels' path. A setting whose value differs between
runs, or changes within a run at a restart, is named with the runs and their values; a setting a run.json does not
record (written by an older nanoact) is left out of the comparison. A dirty tree's diff is in the run directory
(source.diff; source_N.diff for a start at step N).
"""


def kernel_text(decisions):
    """The activation path of recorded kernel decisions {family: {"impl", ...}}, e.g. 'aglu Triton kernel', and the
    fused MLP's (select_fused of activations/policy.py: 'mlp/aglu fused MLP')."""
    if decisions is None:
        return "not recorded"
    labels = {"triton": "Triton kernel", "fused": "fused MLP", "unfused": "unfused MLP"}
    return ", ".join(f"{family} {labels.get(r.get('impl'), 'PyTorch')}"
                     for family, r in sorted(decisions.items())) or "PyTorch (no kernel family)"


def source_text(env):
    """The code of one start: the commit, and whether the tree had uncommitted changes (their diff's hash)."""
    source = env.get("source")
    if source is None:
        return env.get("git")  # older run.json: "COMMIT" or "COMMIT+dirty"
    if source.get("commit") is None:
        return f"unknown ({source.get('why')})"
    if not source.get("dirty"):
        return source["commit"][:12]
    return f"{source['commit'][:12]} + uncommitted changes (diff sha256 {source['diff_sha256'][:12]})"


def setup(env):
    """{setting: text} of one start's environment; settings it does not record are absent."""
    decisions = env.get("decisions") or {}
    precision, compiled = decisions.get("precision") or {}, decisions.get("compile") or {}
    world, accum = env.get("world_size"), env.get("grad_accum")
    values = {
        "precision": precision.get("value"),
        "compile": None if "value" not in compiled else
        (f"on ({compiled['mode']})" if compiled.get("mode") else "on") if compiled["value"] else "off",
        "world size x grad accum": None if world is None or accum is None else f"{world} x {accum}",
        "torch": env.get("torch"), "Triton": env.get("triton"), "CUDA": env.get("cuda"),
        "GPU": env.get("device_name"), "code": source_text(env),
    }
    return {k: str(v) for k, v in values.items() if v is not None}


def kernel_changes(run):
    """[(start step, kernel path)] of a run whose path changed at a restart, else []: each start decides it anew
    when the recorded decision's key (GPU, dtype, shape, compile) is not its own."""
    starts = [(s.get("start_step"), kernel_text((s["environment"].get("decisions") or {}).get("activations")))
              for s in run.segments]
    return starts if len({text for _, text in starts}) > 1 else []


def setup_flags(runs):
    """(across, within): across = [(setting, {value: [run labels]})] for settings whose value differs between
    runs (each run's starts taken together); within = [(run label, setting, [(start step, value)])] for settings
    that changed at a restart, the kernel path included."""
    values, within = {}, []
    for run in runs:
        per_start = [(s.get("start_step"), setup(s.get("environment") or {})) for s in run.segments]
        for name in dict.fromkeys(k for _, start_values in per_start for k in start_values):
            seen = [(step, v[name]) for step, v in per_start if name in v]
            if len({value for _, value in seen}) > 1:
                within.append((run.label, name, seen))
            values.setdefault(name, {}).setdefault(" / ".join(dict.fromkeys(v for _, v in seen)), []).append(run.label)
        if changes := kernel_changes(run):
            within.append((run.label, "kernel path", changes))
    across = [(name, by_value) for name, by_value in values.items() if len(by_value) > 1]
    return across, within


def flag_lines(runs):
    """Markdown bullets naming every setting that differs between the runs or within one; [] when none does."""
    across, within = setup_flags(runs)
    lines = []
    for name, by_value in across:
        lines.append(f"- **{name} differs between runs**: " + "; ".join(
            f"{value} ({', '.join(labels)})" for value, labels in by_value.items()) +
            "; their differences are then also this setting's.")
    for label, name, seen in within:
        lines.append(f"- **{label} changed {name} at a restart**: " + "; ".join(
            f"from step {'?' if step is None else step}: {value}" for step, value in seen) + ".")
    return lines
