"""The tuning audit in a ladder's report, and the verdicts it withholds: each arm's optimum at the audit's size
with its interval and the lr it ran there judged against it (stats/lr_audit.py); an arm whose lr the audit refutes
(every arm, where it refutes the baseline's) has its pairs at the sizes it did not pick its lr at, its multipliers
and its trend "not declared", out of Holm's family, with the reason and the command that measures it at its audited
optimum: a verdict whose lr the audit refutes is the lr's, not the arm's. Also the report's small formatting helpers
(size labels, intervals, rates), which the rest of analysis/ladder_report.py shares."""
from analysis.ladder_points import plan_of, shape_of
from stats import lr_audit


def size_label(size):
    return "L{}-d{}-h{}".format(*size)


def ci_text(low, high, fmt="{:.3g}"):
    return "[" + ", ".join("-" if v is None else fmt.format(v) for v in (low, high)) + "]"


def rate_text(r):
    return f"{r['rate']:.1%} [{r['ci'][0]:.1%}, {r['ci'][1]:.1%}]"


def audit_section(ladder, result, chosen, options):
    """The tuning audit into result["audit"] (None without one): each arm's optimum at the audit's size with its
    interval (stats/lr_audit.py), and the lr it ran there judged against it within the tolerance; its markdown."""
    if ladder.audit_size is None:
        result["audit"] = None
        return []
    where, arms, missing = size_label(ladder.audit_size), {}, []
    for a in ladder.arms:
        grid = {lr: {seed: p["loss"] for seed, p in seeds.items()} for lr, seeds in ladder.audit.get(a, {}).items()}
        picked = chosen.get((ladder.audit_size, a)) or next(iter(result["best_lr"].get(a, {}).values()), None)
        arms[a] = None if picked is None else lr_audit.audit(picked, grid, options.audit())
        if arms[a] is None:
            missing.append(a)
    seeds = sorted({seed for x in arms.values() if x for seed in x["seeds"]})
    refuted = [a for a, x in arms.items() if x and x["status"] == "refuted"]
    text = (f"the tuning audit at {where} (seeds {', '.join(map(str, seeds)) or '-'}) "
            + ("refutes " + ", ".join(f"{a}'s lr ({_audit_words(arms[a])})" for a in refuted) if refuted else
               "refutes no arm's lr") + (f"; no finished audit for {', '.join(missing)}" if missing else ""))
    result["audit"] = {"size": where, "seeds": seeds, "tolerance": options.tolerance, "arms": arms,
                       "refuted": refuted, "missing": missing, "text": text}
    lines = [f"- {a}: ran {x['picked']:g} at {where}; {_audit_words(x)}: **{x['status']}**"
             + (f" ({_audit_rates(x['calibration'])})" if x["calibration"] else "") + "."
             for a, x in arms.items() if x]
    return ["## Tuning audit", "", f"Each arm again at {where} on the grid's seeds {', '.join(map(str, seeds))}, at "
            "lrs around the one it ran there; its optimum there is the vertex of a parabola in log lr fitted to "
            f"those runs (one level per seed), with its {options.level:.0%} Fieller interval (stats/lr_audit.py). "
            f"An arm's lr is refuted where every optimum in the interval lies more than {options.tolerance:g}x from "
            "it (the tolerance, --lr-tolerance): its multipliers and trends at the sizes it did not pick its lr at "
            "are then not declared. Within: every optimum in the interval lies within the tolerance. Otherwise: not "
            "resolved (more audit seeds narrow the interval).", "", *lines, "", f"Result: {text}.", ""]


def _audit_words(x):
    """How far one arm's audited optimum lies from the lr it ran, in words."""
    if x["optimum"] is None:
        return (f"its audit losses do not curve upward about a minimum (curvature {x['curvature']:.3g}): no "
                "optimum to read")
    if x["ci"] is None:
        return (f"its optimum {x['optimum']:.3g} (interval unbounded: the curvature is not resolved by "
                f"{len(x['seeds'])} seed(s)), the lr {x['ratio']:.3g}x it")
    return (f"its optimum {x['optimum']:.3g} {ci_text(*x['ci'])}, the lr {x['ratio']:.3g}x it "
            f"{ci_text(*x['ratio_ci'])}")


def _audit_rates(cal):
    """The audit's measured rates on simulated grids of its own configuration, in words."""
    return "; ".join(f"on a {name}: the interval covered {rate_text(cal[key]['coverage'])}, a lr at the tolerance "
                     f"refuted {rate_text(cal[key]['false_refutation'])}"
                     for key, name in (("parabola", "parabola"),
                                       ("skewed", f"curve {lr_audit.SKEW:g}x steeper above its optimum"))) \
        + f" ({cal['n']} simulated audits of {cal['assumptions']})"


def withheld(ladder, result, out):
    """{arm: {"reason", "settle", "sizes"}} of the arms whose verdicts the audit withholds: an arm whose lr it
    refutes, or every arm where it refutes the baseline's (each comparison rests on both lrs), at the sizes where the
    arm's lr was not picked on a grid of that size itself."""
    audit = result.get("audit") or {}
    out_of = {}
    for a in ladder.arms[1:]:
        off = [b for b in (ladder.baseline, a) if b in audit.get("refuted", [])]
        if not off:
            continue
        x = audit["arms"][off[-1]]
        picked_at = set(result["best_lr"].get(a, {})) & set(result["best_lr"].get(ladder.baseline, {}))
        out_of[a] = {"sizes": [size_label(s) for s in ladder.sizes if size_label(s) not in picked_at],
                     "reason": f"the audit at {audit['size']} refutes {off[-1]}'s lr {x['picked']:g} (its optimum "
                               f"{x['optimum']:.3g} {ci_text(*x['ci'])}, beyond the {audit['tolerance']:g}x tolerance)",
                     "settle": settle_command(out, ladder, off[-1], x)}
    return out_of


def settle_command(out, ladder, arm, x):
    """The command that measures an arm whose lr the audit refuted at its audited optimum: its variant at the
    audit's size on the compared seeds (a sweep of its own, beside the baseline's runs at that size here)."""
    plan = plan_of(out)
    options = list((plan.get("variants") or {}).get(arm) or ["--act", arm])
    act = options.pop(options.index("--act") + 1) if "--act" in options else arm
    options = [o for o in options if o != "--act"]
    size = next((opts for opts in ((plan.get("ladder") or {}).get("sizes") or {}).values()
                 if shape_of(opts) == ladder.audit_size), [])
    seeds = sorted({p["seed"] for p in ladder.points if p["size"] == ladder.audit_size and p["arm"] == arm})
    return " ".join(["python -m sweep", *(["--trainer", plan["trainer"]] if plan.get("trainer") else []),
                     "--config", plan.get("config", "CONFIG"), "--acts", act, "--lrs", f"{x['optimum']:.3g}",
                     "--seeds", ",".join(map(str, seeds)), "--out-dir", str(out / f"{arm}_at_audited_lr"),
                     *options, *size, *plan.get("overrides", [])])


def withhold(result, arm, size, claim):
    """Whether the audit withholds a verdict of `arm` at `size` (None: the fit's, over every size): then the claim
    (kind, name, the dict of its numbers) is marked not declared, with the reason and the command that would settle
    it, into result["not_declared"]."""
    held = result["withheld"].get(arm)
    if not held or (size is not None and size not in held["sizes"]):
        return False
    kind, name, where = claim
    where.update(not_declared=held["reason"], settle=held["settle"])
    result["not_declared"].append({"kind": kind, "claim": name, "reason": held["reason"], "settle": held["settle"]})
    return True


def verdicts(family, level, not_declared):
    """The declared verdicts under Holm, and those the tuning audit withholds (not in the family: a verdict whose lr
    the audit refutes is the lr's, not the arm's), each with its reason and the command that would settle it."""
    alpha = 1 - level
    declared = [f"{name} (Holm p {where['p_holm']:.3g})" for _, name, _, where in family if where["p_holm"] < alpha]
    kinds = {"pair": "per-size pairs", "multiplier": "headline multipliers (m = 1 at the reference compute?)",
             "trend": "trends (slope 0?)"}
    counts = ", ".join(f"{sum(k == kind for k, *_ in family)} {text}" for kind, text in kinds.items())
    held = {}
    for claim in not_declared:
        held.setdefault((claim["reason"], claim["settle"]), []).append(claim["claim"])
    return ["## Verdicts", "", f"Error control: family-wise error rate {alpha:.3g}, Holm over the {len(family)} "
            f"verdicts of this report ({counts}); the lr grids' pairs and the comparisons at a size whose lr was "
            "picked on the compared runs (and the fit's, where it spans such a size) are unadjusted, exploratory, "
            "and declare nothing; nor does a comparison whose lr the tuning audit refutes (it leaves the family). "
            "Holm controls its error with the lrs held fixed, not over the lr stage (configuration f in "
            "docs/comparing_runs.md).", "",
            f"Declared: {'; '.join(declared) if declared else 'none'}.", "",
            *[f"Not declared: {', '.join(claims)}: {reason}. To settle it: `{settle}`." for (reason, settle), claims
              in held.items()], ""]
