"""The tuning audit in a ladder's report, and the verdicts it withholds: each arm's optimum at the audit's size
with its interval and the lr it ran there judged against it (stats/lr_audit.py). Only an lr the audit puts within
the tolerance lets an arm declare: an arm whose audit refutes its lr, cannot tell at its seeds ("not resolved") or has
not finished (every arm, where the baseline's is any of these: each comparison rests on both lrs) has its pairs at
the sizes it did not pick its lr at, its multipliers and its trend "not declared", out of Holm's family, with the
reason and the command that settles it (the arm at its audited optimum, or the audit on more seeds): a verdict
whose lr the audit does not vouch for is the lr's, not the arm's. Also the report's small formatting helpers (size
labels, intervals, rates), which the rest of analysis/ladder_report.py shares."""
import json
import math

from analysis.ladder_points import plan_of, shape_of
from stats import lr_audit

AFTER_AUDIT = "after_audit.json"  # OUT's record of the re-runs after the tuning audit (sweep/schedule.py AfterAudit)


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
    unresolved = [a for a, x in arms.items() if x and x["status"] == "not resolved"]
    text = (f"the tuning audit at {where} (seeds {', '.join(map(str, seeds)) or '-'}) "
            + ("refutes " + ", ".join(f"{a}'s lr ({_audit_words(arms[a])})" for a in refuted) if refuted else
               "refutes no arm's lr")
            + (f"; it cannot tell for {', '.join(unresolved)} at {len(seeds)} seed(s)" if unresolved else "")
            + (f"; no finished audit for {', '.join(missing)}" if missing else ""))
    result["audit"] = {"size": where, "seeds": seeds, "tolerance": options.tolerance, "arms": arms,
                       "refuted": refuted, "unresolved": unresolved, "missing": missing, "text": text}
    lines = [f"- {a}: ran {x['picked']:g} at {where}; {_audit_words(x)}: **{x['status']}**"
             + (f" ({_audit_rates(x['calibration'])})" if x["calibration"] else "") + "."
             for a, x in arms.items() if x]
    return ["## Tuning audit", "", f"Each arm again at {where} on the grid's seeds {', '.join(map(str, seeds))}, at "
            "lrs around the one it ran there; its optimum there is the vertex of a parabola in log lr fitted to "
            f"those runs (one level per seed), with its {options.level:.0%} Fieller interval (stats/lr_audit.py). "
            f"An arm's lr is within where every optimum in the interval lies within {options.tolerance:g}x of it "
            "(the tolerance, --lr-tolerance), refuted where every one lies beyond, otherwise not resolved (more "
            "audit seeds narrow the interval). Only within lets the arm declare: otherwise its pairs at the sizes it "
            "did not pick its lr at, its multipliers and its trends are not declared (every arm's, where it is the "
            "baseline's).", "", *lines, "", f"Result: {text}.", ""]


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


def reruns_of(out, points, lr_seeds):
    """The plan's rerun_refuted: ({arm: {size: the re-run's lr}} from OUT/after_audit.json ({} without one), the
    points without those each finished re-run supersedes (the arm's compared runs at another lr at that size))."""
    path = out / AFTER_AUDIT
    reruns = json.loads(path.read_text()).get("reruns", {}) if path.is_file() else {}
    sizes = {name: shape_of(opts) for name, opts in ((plan_of(out).get("ladder") or {}).get("sizes") or {}).items()}
    lrs = {(arm, sizes[name]): lr for arm, by_size in reruns.items() for name, lr in by_size.items() if name in sizes}

    def rerun(p):
        return (p["arm"], p["size"]) in lrs and math.isclose(p["lr"], lrs[(p["arm"], p["size"])], rel_tol=1e-6)

    done = {(p["arm"], p["size"]) for p in points if rerun(p) and p["seed"] not in lr_seeds}
    return reruns, [p for p in points if (p["arm"], p["size"]) not in done or rerun(p) or p["seed"] in lr_seeds]


def withheld(ladder, result, out):
    """{arm: {"reason", "settle", "sizes"}} of the arms whose verdicts the audit withholds: an arm whose lr it does
    not put within the tolerance (refuted, not resolved, or no finished audit), or every arm where the baseline's is
    so (each comparison rests on both lrs), at the sizes where the arm's lr was not picked on a grid of that size
    itself. A plan without an audit withholds nothing (its verdicts say they rest on the lr picks)."""
    audit = result.get("audit")
    if not audit:
        return {}
    out_of = {}
    for a in ladder.arms[1:]:
        off = [b for b in (ladder.baseline, a) if (audit["arms"].get(b) or {}).get("status") != "within"]
        if not off:
            continue
        picked_at = set(result["best_lr"].get(a, {})) & set(result["best_lr"].get(ladder.baseline, {}))
        reasons = [_withheld_reason(audit, b) for b in off]
        out_of[a] = {"sizes": [size_label(s) for s in ladder.sizes if size_label(s) not in picked_at],
                     "reason": "; ".join(reason for reason, _ in reasons),
                     "settle": " && ".join(settle(out, ladder, b, audit["arms"].get(b)) for b, (_, settle) in
                                           zip(off, reasons))}
    return out_of


def _withheld_reason(audit, arm):
    """(why the audit does not vouch for one arm's lr, the function giving the command that settles it)."""
    x, where, tolerance = audit["arms"].get(arm), audit["size"], audit["tolerance"]
    if x is None:
        return f"{arm} has no finished tuning audit at {where}", audit_seeds_command
    if x["status"] == "refuted":
        return (f"the audit at {where} refutes {arm}'s lr {x['picked']:g} (its optimum {x['optimum']:.3g} "
                f"{ci_text(*x['ci'])}, beyond the {tolerance:g}x tolerance)"), settle_command
    return (f"the audit cannot tell at {len(x['seeds'])} seeds whether {arm}'s lr {x['picked']:g} at "
            f"{where} lies within {tolerance:g}x of its optimum ({_audit_words(x)})"), audit_seeds_command


def _sweep_command(out, ladder, arm, lrs, seeds, sub):
    """python -m sweep running one arm's variant at the audit's size, at lrs on seeds, into out/sub (a sweep of its
    own, beside the ladder's runs)."""
    plan = plan_of(out)
    options = list((plan.get("variants") or {}).get(arm) or ["--act", arm])
    act = options.pop(options.index("--act") + 1) if "--act" in options else arm
    options = [o for o in options if o != "--act"]
    size = next((opts for opts in ((plan.get("ladder") or {}).get("sizes") or {}).values()
                 if shape_of(opts) == ladder.audit_size), [])
    return " ".join(["python -m sweep", *(["--trainer", plan["trainer"]] if plan.get("trainer") else []),
                     "--config", plan.get("config", "CONFIG"), "--acts", act,
                     "--lrs", ",".join(f"{lr:.3g}" for lr in lrs),
                     "--seeds", ",".join(map(str, seeds)), "--out-dir", str(out / sub),
                     *options, *size, *plan.get("overrides", [])])


def settle_command(out, ladder, arm, x):
    """The command that measures an arm whose lr the audit refuted at its audited optimum: its variant at the
    audit's size on the compared seeds (a sweep of its own, beside the baseline's runs at that size here)."""
    seeds = sorted({p["seed"] for p in ladder.points if p["size"] == ladder.audit_size and p["arm"] == arm})
    return _sweep_command(out, ladder, arm, [x["optimum"]], seeds, f"{arm}_at_audited_lr")


def audit_seeds_command(out, ladder, arm, x):
    """The command that settles an audit that cannot tell (or has not finished): the arm at the audit's lrs on as
    many more of the plan's lr seeds as it has (new ones above every seed where none is left), its runs then moved
    into the ladder's directory, where the report reads them as the audit's, and the report written again."""
    have = x["seeds"] if x else []
    lrs = x["lrs"] if x else sorted((ladder.audit or {}).get(arm) or {})
    if not lrs:  # none of its audit's runs finished: the plan's own command resumes them
        return f"python -m sweep --status {out}"
    spare = [s for s in sorted(ladder.lr_seeds) if s not in have][:max(len(have), lr_audit.AUDIT_SEEDS)]
    top = max([*ladder.lr_seeds, *(p["seed"] for p in ladder.points)], default=0)
    new = [top + 1 + i for i in range(max(len(have), lr_audit.AUDIT_SEEDS) - len(spare))]
    sub = f"{arm}_audit_seeds"
    text = (f"{_sweep_command(out, ladder, arm, lrs, spare + new, sub)} && mv {out / sub}/{arm}_* {out}/ && "
            f"python -m sweep --report-only {out}")
    return text + (f" (with seeds {', '.join(map(str, new))} added to ladder.lr_seeds in {out / 'sweep_plan.json'})"
                   if new else "")


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
    the audit does not vouch for is the lr's, not the arm's), each with its reason and the command that settles it."""
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
            "and declare nothing; nor does a comparison whose lr the tuning audit does not put within its tolerance "
            "(refuted or not resolved: it leaves the family). "
            "Holm controls its error with the lrs held fixed, not over the lr stage (configuration f in "
            "docs/comparing_runs.md).", "",
            f"Declared: {'; '.join(declared) if declared else 'none'}.", "",
            *[f"Not declared: {', '.join(claims)}: {reason}. To settle it: `{settle}`." for (reason, settle), claims
              in held.items()], ""]
