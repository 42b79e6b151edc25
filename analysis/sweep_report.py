"""The report of a sweep directory: what the seeds say and what they could have said.

For every variant, mean ± sample std over seeds; for every variant against its baseline, the paired
difference over the seeds both finished (mean, std, t, 95% interval) and its power: the smallest difference
these seeds detect at 80% power and alpha 0.05, and the seeds a target difference needs (--target-diff for
the final val loss, else the observed difference). A variant whose seed std is more than twice its
baseline's is flagged. Each variant's parameter count (run.json's, from the model) is stated, and a variant
whose count outside the embeddings differs from its baseline's by more than 0.5% is flagged: its comparison is
then also one of model size (a gated MLP at the wrong width, say). So is every setting besides the config that
differs between any runs, or within one at a restart (analysis/run_setup.py). The claims "this pair differs on this
metric" form one family whose error rate is held at ALPHA (Holm-adjusted p per pair and metric, holm_family). An A/A
control (the baseline again with another init stream) is reported first: if one of its metrics differs at that
family-wise rate (Holm over its own metrics), identical settings differ and no interval of the sweep can be
trusted.
For HellaSwag, where every run is scored on the same items, each pair also gets the item-level interval of its
difference (from the final evaluation's items files, eval/hellaswag_items.py): the per-seed interval answers
"another seed of training", the item-level one "another sample of items"; a claim needs both to exclude 0.
Every declared downstream metric (HellaSwag acc, acc_norm and the gold ending's bits per byte) also gets its
difference with seeds and items both sampled and its minimum detectable effect, and every metric its
signal-to-noise over the arms (analysis/downstream.py).
Written to sweep.md, sweep.json and compare.png (analysis/sweep_plot.py) in the sweep directory.
"""
import json
from dataclasses import dataclass
from pathlib import Path

from analysis import downstream, literature_measures
from analysis.compare import plot_telemetry, table
from analysis.run_setup import flag_lines, kernel_text
from analysis.arms import arms_of
from analysis.runs import HELLASWAG_ACC_NORM, RunError, finished, load_runs, markdown_table, metrics_of, summary
from analysis.sweep_plot import plot_sweep
from eval import hellaswag_items
from eval.compare_items import shared_items
from eval.hellaswag_items import ItemsError
from stats.family import adjust
from stats.significance import detectable_difference, item_level, mean_std, mcnemar_exact, paired, seeds_needed

# the metrics compared over seeds: the final val loss, each plotted in-loop metric the runs declare, test BLEU
FIRST, LAST = [("final_val", "final val loss")], [("test_bleu_greedy", "test BLEU greedy"),
                                                  ("test_bleu_beam", "test BLEU beam")]
UNITS = {"final_val": "nats", "test_bleu_greedy": "BLEU", "test_bleu_beam": "BLEU"}  # and each in-loop metric's
HELLA = HELLASWAG_ACC_NORM.name  # the in-loop HellaSwag number with items files (an item-level interval)
SPREAD_FLAG = 2.0  # a variant's seed std above this multiple of its baseline's gets flagged
PARAM_FLAG = 0.005  # a variant whose non-embedding parameter count differs from its baseline's by more gets flagged
ALPHA = 0.05  # the family-wise error rate of the report's verdicts: Holm over a family of claims (holm_family)


def _num(x):
    return f"{abs(x):.2g}"


def add_power(pair, key, target_diff=None):
    """Adds detectable (80% power, alpha 0.05), target and seeds_needed to a paired() result."""
    pair["detectable"] = detectable_difference(pair["std"], pair["n"])
    pair["target"] = target_diff if key == "final_val" and target_diff is not None else pair["mean"]
    pair["seeds_needed"] = seeds_needed(pair["std"], pair["target"])
    return pair


# the in-loop HellaSwag number the sweep reads (HELLA): completion scoring, acc_norm
ITEM_KEY = ("completion", "acc_norm")


def items_of(runs):
    """{(variant, seed): Items} of the finished runs' own latest items files (their final evaluation's: the
    scoring their logged acc_norm comes from, never eval/hellaswag.py's)."""
    found = {}
    for run in runs:
        path = hellaswag_items.newest(run.path)
        if path is not None and run.arm is not None:
            try:
                items = hellaswag_items.read(path)
            except ItemsError as e:
                raise SystemExit(f"error: {e}") from None
            if not hellaswag_items.from_training(items):
                raise SystemExit(f"error: {path} holds eval/hellaswag.py's scoring, which an older nanoact wrote over "
                                 "the run's own final evaluation; move it out of the run directory (the item-level "
                                 "interval then leaves this run out)")
            found[(run.arm, run.setting("seed"))] = items
    return found


def item_interval(items, variant, base):
    """Item-level interval of variant - base on HellaSwag acc_norm over the seeds both have items for: per item,
    the mean over seeds of (variant right) - (base right); the items are the sampling unit
    (stats.significance.item_level). Per seed: the discordant items and the exact McNemar p. None without a seed of
    both."""
    seeds = sorted(s for v, s in items if v == variant and (base, s) in items)
    seeds = [s for s in seeds if ITEM_KEY in items[(variant, s)].preds and ITEM_KEY in items[(base, s)].preds]
    if not seeds:
        return None
    indices, per_seed = None, []
    for s in seeds:
        a, b = items[(variant, s)], items[(base, s)]
        try:
            shared = shared_items(a, b)
            if indices is not None and shared != indices:
                raise ItemsError(f"{a.path}: other items than seed {seeds[0]}'s; score every run on the same items")
        except ItemsError as e:
            raise SystemExit(f"error: {e}") from None
        indices = shared
        right_a, right_b = a.correct(*ITEM_KEY, indices), b.correct(*ITEM_KEY, indices)
        only_a = sum(x and not y for x, y in zip(right_a, right_b))
        only_b = sum(y and not x for x, y in zip(right_a, right_b))
        per_seed.append((right_a, right_b, only_a, only_b))
    diffs = [sum(ra[i] - rb[i] for ra, rb, _, _ in per_seed) / len(seeds) for i in range(len(indices))]
    return {**item_level(diffs), "seeds": seeds, "discordant": [a + b for _, _, a, b in per_seed],
            "p_mcnemar": [mcnemar_exact(a, b) for _, _, a, b in per_seed]}


def power_sentence(name, metric, unit, pair, named):
    """One plain sentence: what these seeds can detect, and what the target difference needs."""
    n = pair["n"]
    if n < 2:
        return f"{name}, {metric}: {n} shared seed{'s' * (n != 1)}: no interval and no detectable difference yet."
    if pair["std"] == 0:
        text = f"{name}, {metric}: the {n} paired differences are identical, so any difference is detected"
    else:
        which = "the named" if named else "the observed"
        text = f"{name}, {metric}: {n} seeds can detect {_num(pair['detectable'])} {unit}"
        if not pair["target"]:
            text += f"; {which} difference is 0, which no number of seeds tells from 0"
        elif pair["seeds_needed"] is None:
            text += f"; {which} {_num(pair['target'])} would need more than 10,000 seeds"
        else:
            text += f"; {which} {_num(pair['target'])} would need {pair['seeds_needed']} seeds"
    return text + "."


def hellaswag_intervals(pairs, baselines):
    """The per-seed and the item-level interval of each pair's HellaSwag difference side by side, and what
    each answers; [] when no pair has items files."""
    rows = []
    for a, per in pairs.items():
        p = per.get(HELLA) or {}
        items = p.get("item_level")
        if items is None:
            continue
        ci = lambda c: "-" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"
        rows.append([f"{a} - {baselines[a]}", len(items["seeds"]), f"{items['items']:,}", f"{items['mean']:+.4f}",
                     ci(p["ci95"]), ci(items["ci95"]), ", ".join(f"{d:,}" for d in items["discordant"]),
                     ", ".join(f"{q:.3g}" for q in items["p_mcnemar"])])
    if not rows:
        return []
    return ["HellaSwag acc_norm (completion scoring, final evaluation): two intervals for one difference. The per-seed "
            "interval (t over seeds, above) answers *would another seed of training give this difference on these "
            "items?*; it cannot see which items the benchmark happens to hold. The item-level interval answers *would "
            "another sample of items like these give it, for these trained models?*: per item the difference of "
            "right answers averaged over the seeds, mean ± 1.96 sd/√items; it cannot see seed-to-seed variation. "
            "Only the items the two models answer differently (discordant) carry information, so it is usually much "
            "narrower than two accuracies' Wilson intervals suggest. \"X beats the baseline\" needs both to exclude "
            "0. Per seed: the discordant items and the exact McNemar p (`python -m eval.compare_items` on two runs "
            "gives the full comparison):", "",
            markdown_table(["pair", "seeds", "items", "diff", "per-seed 95% CI", "item-level 95% CI",
                            "discordant items per seed", "McNemar p per seed"], rows), ""]


def spread_flags(per_act, baselines, metrics):
    """[(variant, metric key, its std, baseline std, ratio)] for seed stds above SPREAD_FLAG x the baseline's."""
    flags = []
    for a, base in baselines.items():
        for k, _ in metrics:
            s, b = per_act[a].get(k, {}).get("std"), per_act.get(base, {}).get(k, {}).get("std")
            if a != base and s is not None and b and s > SPREAD_FLAG * b:
                flags.append((a, k, s, b, s / b))
    return flags


def kernel_paths(runs):
    """{variant: the path its activation ran, from each run's recorded kernel decisions}; a variant whose seeds ran
    different paths is named MIXED with each seed's (its seeds then differ by more than the seed)."""
    per = {}
    for run in runs:
        per.setdefault(run.arm, {})[run.setting("seed")] = kernel_text(run.kernels)
    return {a: next(iter(set(seeds.values()))) if len(set(seeds.values())) == 1 else
            "MIXED: " + "; ".join(f"seed {seed}: {text}" for seed, text in sorted(seeds.items(), key=str))
            for a, seeds in per.items()}


def run_params(run):
    """The parameter counts the trainer wrote into run.json ({"total", "non_embedding", "mlp_per_layer"}), or None."""
    try:
        return json.loads((run.path / "run.json").read_text())["environment"]["params"] or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def param_flags(params, baselines):
    """[(variant, its non-embedding count, its baseline's, relative difference)] beyond PARAM_FLAG."""
    flags = []
    for a, base in baselines.items():
        mine, theirs = (params.get(v, {}).get("non_embedding") for v in (a, base))
        if a != base and mine and theirs and abs(mine - theirs) > PARAM_FLAG * theirs:
            flags.append((a, mine, theirs, mine / theirs - 1))
    return flags


def claim_p(pair):
    """The p of the claim "this pair differs on this metric": its paired t-test over seeds; where the metric also
    has an item-level interval (HellaSwag) the claim needs both to exclude 0, so its p is the larger of the two
    (an intersection-union test: at level alpha whenever the per-seed test is). None below 2 seeds."""
    items = pair.get("item_level") or {}
    if pair["p"] is None or items.get("p") is None:
        return pair["p"]
    return max(pair["p"], items["p"])


def holm_family(pairs, labels, metrics):
    """Holm-adjusts the claim p of every (pair, metric) of the pairs in labels as one family, into each pair's
    "p_holm" (None without a p): a claim is declared where p_holm < ALPHA, which keeps the chance of any false
    claim in the family at most ALPHA. Returns the family's size."""
    claims = [pairs[a][k] for a in labels for k, _ in metrics]
    for claim in claims:
        claim["p_holm"] = None
    family = [(claim_p(claim), claim) for claim in claims if claim_p(claim) is not None]
    adjust(family)
    return len(family)


def control_verdict(control, base, pairs, metrics):
    """(reliable: True/False/None, sentence) for the A/A control against its baseline: unreliable where a metric
    differs at family-wise error rate ALPHA, Holm over the control's own metrics (pairs[k]["p_holm"]), so that a
    sound sweep is called unreliable at most ALPHA of the time (any interval excluding 0 would, with four
    metrics, do so about 19% of the time: tests/test_sweep_family.py)."""
    tested = [(name, pairs[k]) for k, name in metrics if pairs[k].get("p_holm") is not None]
    head = f"A/A control {control} - {base} (the baseline again, same seeds and data order, another init stream)"
    if not tested:
        return None, f"{head}: fewer than 2 shared seeds, no verdict yet."
    bad = [(name, p) for name, p in tested if p["p_holm"] < ALPHA]
    shown = bad or tested
    detail = "; ".join(f"{name} {p['mean']:+.4f}, 95% CI [{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}], Holm p "
                       f"{p['p_holm']:.3g}" for name, p in shown)
    family = (f"at family-wise error rate {ALPHA}, Holm over its {len(tested)} metric{'s' * (len(tested) > 1)}"
              f"{'; HellaSwag needs its item-level interval to exclude 0 too' if HELLA in pairs else ''}")
    if bad:
        return False, (f"**{head}: {detail}: {'these differ' if len(shown) > 1 else 'differs'} from 0 ({family}). "
                       "The sweep is unreliable: identical settings differ beyond their noise, so the seeds do not "
                       "capture the run-to-run noise (too few seeds for a heavy-tailed spread, nondeterminism, or a "
                       "difference that is not the variant's). Do not read the intervals below as evidence.**")
    return True, (f"{head}: {detail}: no metric differs from 0 ({family}), as it must. Its paired std is what a "
                  "change of init alone moves the result; the other variants share the baseline's data order and, "
                  "at each seed, the start of every weight they have in common (same name and shape: each is drawn "
                  "from its own stream, so a gated MLP's extra matrix or AGLU's kappa/lam shift no other).")


def declared_sentence(pairs, baselines, metrics, control, size):
    """One sentence naming the claims the report declares: the pairs (the control left out) and metrics whose
    Holm-adjusted p is below ALPHA."""
    found = [f"{a} - {baselines[a]} on {name} ({pairs[a][k]['mean']:+.4f}, Holm p {pairs[a][k]['p_holm']:.3g})"
             for a in pairs if a != control for k, name in metrics
             if pairs[a][k]["p_holm"] is not None and pairs[a][k]["p_holm"] < ALPHA]
    family = (f"family-wise error rate {ALPHA}: Holm over the {size} pair-metric claims of this sweep, the A/A "
              "control left out")
    if HELLA in dict(metrics):
        family += "; a HellaSwag claim needs its item-level interval to exclude 0 too"
    if not found:
        return f"Declared different at {family}: none."
    return f"Declared different at {family}: {'; '.join(found)}."


def seed_values(done, order, candidates):
    """({variant: {metric key: {seed: value}}} of the finished runs, the candidates (key, name) any run has)."""
    rows = {a: {} for a in order}
    for run in done:
        if run.arm in rows:
            s = summary(run)
            for key, _ in candidates:
                if s.get(key) is not None:
                    rows[run.arm].setdefault(key, {})[run.setting("seed")] = s[key]
    return rows, [(k, name) for k, name in candidates if any(k in r for r in rows.values())]


@dataclass
class SweepRuns:
    """A sweep directory's runs as its report reads them."""
    out: Path
    runs: list  # every run, in the report's order (variant, then seed)
    done: list  # the finished runs
    compared: list  # the finished runs of the variants compared: what the statistics read
    unfinished: list  # the labels of the runs left out
    order: list  # the variants with a finished run, the A/A control right after its baseline
    baseline: str | None
    control: str | None  # the A/A control's label
    baselines: dict  # variant -> the variant it is compared against
    in_loop: list  # the plotted in-loop metrics (training/in_loop.py's Metric) the finished runs declare

    def of(self, variant):
        return [run for run in self.compared if run.arm == variant]


def read_sweep(out, acts=None, baseline=None):
    """The SweepRuns of a sweep directory: the variants in the order of acts, else the plan's, else sorted."""
    plan = json.loads((out / "sweep_plan.json").read_text()) if (out / "sweep_plan.json").is_file() else {}
    dirs = sorted(p for p in out.iterdir()
                  if p.is_dir() and ((p / "log.txt").is_file() or (p / "metrics.jsonl").is_file()))
    if not dirs:
        raise SystemExit(f"error: {out}: no run directories (with log.txt or metrics.jsonl) inside")
    try:
        runs = load_runs(dirs)
    except RunError as e:
        raise SystemExit(f"error: {e}") from None
    for run, arm in zip(runs, arms_of(runs, plan.get("variants") or {})):
        run.arm = arm  # analysis/arms.py's rule, the ladder report's too
        if run.setting("seed") is not None:
            run.label = f"{run.arm}/seed{run.setting('seed')}"
    done = [run for run in runs if finished(run.path)]
    unfinished = [run.label for run in runs if run not in done]
    order = acts or plan.get("acts") or sorted({r.arm for r in done})
    order = [a for a in order if any(r.arm == a for r in done)]
    baseline = baseline or plan.get("baseline") or (order[0] if order else None)
    control = plan.get("control") if plan.get("control") in order else None
    if control:  # shown first, right after its baseline
        order.remove(control)
        order.insert(order.index(baseline) + 1 if baseline in order else 0, control)
    rank = {a: i for i, a in enumerate(order)}
    runs.sort(key=lambda r: (rank.get(r.arm, len(rank)), str(r.arm), r.setting("seed") or 0))
    baselines = {a: (plan.get("baselines") or {}).get(a) or baseline for a in order}
    return SweepRuns(out, runs, done, [r for r in done if r.arm in rank], unfinished, order, baseline,
                     control, baselines, [m for m in metrics_of(done).values() if m.plotted])


def compare_variants(sweep, target_diff):
    """(metrics logged, {variant: {metric: mean_std}}, {variant: {metric: paired difference to its baseline}}, the
    size of the claims' Holm family): each pair with its power, HellaSwag's with its item-level interval, every
    claim Holm-adjusted (the A/A control's over its own metrics)."""
    rows, metrics = seed_values(sweep.compared, sweep.order,
                                [*FIRST, *((m.name, m.label) for m in sweep.in_loop), *LAST])
    per_act = {a: {k: mean_std(list(rows[a].get(k, {}).values())) for k, _ in metrics} for a in sweep.order}
    baselines = sweep.baselines
    pairs = {a: {k: add_power(paired(rows[baselines[a]].get(k, {}), rows[a].get(k, {})), k, target_diff)
                 for k, _ in metrics} for a in sweep.order if a != baselines[a] and baselines[a] in rows}
    if HELLA in dict(metrics):
        items = items_of(sweep.compared)
        for a, per in pairs.items():
            per[HELLA]["item_level"] = item_interval(items, a, baselines[a])
    family_size = holm_family(pairs, [a for a in pairs if a != sweep.control], metrics)
    if sweep.control in pairs:
        holm_family(pairs, [sweep.control], metrics)
    return metrics, per_act, pairs, family_size


def variant_params(runs):
    """{variant: the parameter counts of its first run that records them}."""
    params = {}
    for run in runs:
        if run_params(run):
            params.setdefault(run.arm, run_params(run))
    return params


def plus_minus(stat):
    if stat["mean"] is None:
        return "-"
    return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if stat["std"] is not None else f"{stat['mean']:.4f}"


def variants_section(sweep, metrics, per_act, params, size_flags, flags, paths, setup_flags):
    """The markdown of each variant on its own: its runs' mean ± std, parameters, kernel path, and what is flagged."""
    order, baselines = sweep.order, sweep.baselines
    md = ["Mean ± sample std over seeds:", "",
          markdown_table(["variant", "n", *[name for _, name in metrics]],
                         [[a, max((s["n"] for s in per_act[a].values()), default=0),
                           *[plus_minus(per_act[a][k]) for k, _ in metrics]] for a in order]), ""]
    if params:
        md += ["Parameters per variant (run.json; outside embeddings: what an MLP's form changes):", "",
               markdown_table(["variant", "parameters", "outside embeddings", "per MLP", "vs baseline"],
                              [[a, f"{params[a]['total']:,}", f"{params[a]['non_embedding']:,}",
                                f"{params[a]['mlp_per_layer']:,}",
                                "-" if a == baselines[a] or baselines[a] not in params else
                                f"{params[a]['non_embedding'] / params[baselines[a]]['non_embedding'] - 1:+.2%}"]
                               for a in order if a in params]), ""]
    for a, m, b, r in size_flags:
        md += [f"- **{a} is not parameter-matched**: {m:,} parameters outside embeddings against {baselines[a]}'s "
               f"{b:,} ({r:+.2%}, more than {PARAM_FLAG:.1%}); its difference also measures model size (for a "
               "gated MLP, set glu_hidden to the width that matches)."]
    if size_flags:
        md.append("")
    for a, k, s, b, ratio in flags:
        md += [f"- **{a} needs more seeds**: its seed std of {dict(metrics)[k]} ({s:.4f}) is {ratio:.1f}x "
               f"{baselines[a]}'s ({b:.4f}); for the precision of the baseline's mean it needs about "
               f"{ratio ** 2:.0f}x the seeds."]
    if flags:
        md.append("")
    md += ["Activation path of each variant (run.json's kernel decisions; every seed of a variant should run the "
           "same one):", "", *[f"- {a}: {paths[a]}" for a in order if a in paths], ""]
    if setup_flags:
        md += ["Settings besides the config that differ between runs or within one (run.json, analysis/run_setup.py):",
               "", *setup_flags, ""]
    return md


def pairs_section(pairs, baselines, metrics, units, control, family_size, target_diff):
    """The markdown of the paired differences: the table, the claims declared, what the seeds can detect."""
    pair_rows, sentences = [], []
    for a, per in pairs.items():
        for k, name in metrics:
            p = per[k]
            pair_rows.append([f"{a} - {baselines[a]}", name, p["n"], plus_minus(p),
                              "-" if p["t"] is None else f"{p['t']:.2f}",
                              "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]",
                              "-" if p["p"] is None else f"{p['p']:.3g}",
                              "-" if p["p_holm"] is None else f"{p['p_holm']:.3g}",
                              "-" if p["detectable"] is None else f"{p['detectable']:.4f}",
                              p["seeds_needed"] or "-"])
            sentences.append("- " + power_sentence(f"{a} - {baselines[a]}", name, units[k], p,
                                                   k == "final_val" and target_diff is not None))
    if not pair_rows:
        return []
    target = "the named difference" if target_diff is not None else "the observed difference"
    return ["Paired differences against the baseline over shared seeds (mean ± std, t = mean/(std/√n), 95% CI "
            "with Student's t quantile, p of the paired t-test; Holm p: adjusted over the family of the sweep's "
            "pair-metric claims, the A/A control over its own metrics, with HellaSwag's claim taking the larger "
            f"of its per-seed and item-level p; a claim holds at Holm p < {ALPHA}); "
            "val loss: negative is better, HellaSwag/BLEU: positive is better. Detectable: the smallest true "
            "difference these seeds find with 80% power at alpha 0.05, (t_0.975 + t_0.80) std/√n with n-1 "
            f"degrees of freedom; seeds: how many {target} needs"
            f"{f' ({target_diff} nats for the val loss)' if target_diff is not None else ''}:", "",
            markdown_table(["pair", "metric", "n", "diff", "t", "95% CI", "p", "Holm p", "detectable (80%)",
                            "seeds needed"], pair_rows), "",
            declared_sentence(pairs, baselines, metrics, control, family_size), "",
            "What these seeds can detect:", "", *sentences, ""]


def measures_section(measured, baselines):
    """The markdown of the literature's measurements paired by seed: exploratory, outside the Holm family."""
    if not literature_measures.sentences(measured, baselines):
        return []
    return ["The literature's measurements at each run's last evaluation (analysis/literature_measures.py: "
            + "; ".join(f"{name}: {what}" for name, (what, _) in literature_measures.SUMMARIES.items())
            + f"), paired by seed; each measure's own 95% interval, unadjusted, exploratory: outside the Holm "
            f"family of the claims above, no error control over these {sum(map(len, measured.values()))} "
            "comparisons (with many null measures some interval excludes 0 by chance), so they declare nothing:",
            "", *literature_measures.sentences(measured, baselines), ""]


def downstream_part(sweep, result):
    """The downstream section (analysis/downstream.py): each declared downstream metric's difference with seeds and
    items both sampled, and every compared metric's signal-to-noise over the arms (the A/A control left out)."""
    declared = metrics_of(sweep.done)
    values = downstream.item_values(sweep.compared, lambda run: run.arm, declared)
    pairs = downstream.downstream_pairs(values, sweep.baselines)
    keys = [*FIRST, *((m.name, m.label) for m in declared.values() if m.plotted or m.name in downstream.DOWNSTREAM),
            *LAST]
    rows, keys = seed_values(sweep.compared, sweep.order, keys)
    arms = [a for a in sweep.order if a != sweep.control]
    snr = downstream.signal_to_noise(rows, keys, arms)
    tasks = downstream.core_task_snr(sweep.compared, arms)
    result["downstream"] = {"paired": pairs, "snr": [{"metric": k, "spread": spread, "seed_sd": sd, "snr": r}
                                                     for k, spread, sd, r in snr],
                            "core_tasks_snr": [{"task": task, "acc": acc, "bpb": bpb} for task, acc, bpb in tasks]}
    names = {**dict(FIRST), **dict(LAST), **{m.name: m.label for m in declared.values()}}
    return downstream.section(pairs, sweep.baselines, snr, names, {m.name: m.unit for m in declared.values()}) + \
        downstream.task_section(tasks)


def report(out_dir, acts=None, baseline=None, target_diff=None):
    """Read every run under out_dir and write sweep.md, sweep.json and compare.png there; returns the markdown.
    Runs are grouped by variant (directory {label}_seed{seed}); each variant is compared with its baseline
    (the plan's `baselines`, else `baseline`, else the first variant). target_diff (final val loss, nats):
    the difference whose seeds the report counts; default the observed one."""
    sweep = read_sweep(Path(out_dir), acts, baseline)
    out, order, baselines, control = sweep.out, sweep.order, sweep.baselines, sweep.control
    metrics, per_act, pairs, family_size = compare_variants(sweep, target_diff)
    flags = spread_flags(per_act, baselines, metrics)
    paths, setup_flags = kernel_paths(sweep.compared), flag_lines(sweep.compared)
    params = variant_params(sweep.compared)
    size_flags = param_flags(params, baselines)
    reliable, verdict = control_verdict(control, baselines[control], pairs[control], metrics) if control in pairs \
        else (None, None)
    result = {"baseline": sweep.baseline, "baselines": baselines, "acts": order, "unfinished": sweep.unfinished,
              "control": control, "control_reliable": reliable, "target_diff": target_diff, "alpha": ALPHA,
              "family_size": family_size,
              "runs": [summary(r) for r in sweep.runs], "per_act": per_act, "paired": pairs, "kernel_paths": paths,
              "spread_flags": [{"variant": a, "metric": k, "std": s, "baseline_std": b, "ratio": r}
                               for a, k, s, b, r in flags],
              "params": params, "param_flags": [{"variant": a, "non_embedding": m, "baseline_non_embedding": b,
                                                 "relative": r} for a, m, b, r in size_flags]}
    md = [f"# Sweep {out}", "", *([verdict, ""] if verdict else []), table(sweep.runs), ""]
    if sweep.unfinished:
        md += [f"Unfinished (left out of the statistics): {', '.join(sweep.unfinished)}", ""]
    md += variants_section(sweep, metrics, per_act, params, size_flags, flags, paths, setup_flags)
    units = {**UNITS, **{m.name: m.unit for m in sweep.in_loop}}
    md += pairs_section(pairs, baselines, metrics, units, control, family_size, target_diff)
    md += hellaswag_intervals(pairs, baselines)
    md += downstream_part(sweep, result)
    result["measures"] = literature_measures.paired_differences({a: sweep.of(a) for a in order},
                                                                {a: baselines[a] for a in pairs})
    md += measures_section(result["measures"], baselines)
    result["setup_flags"] = setup_flags
    text = "\n".join(md)
    (out / "sweep.md").write_text(text)
    (out / "sweep.json").write_text(json.dumps(result, indent=2))
    return text + plots(sweep, result)


def plots(sweep, result):
    """compare.png, and compare_telemetry.png and compare_measures.png where runs logged them; the text to add to
    the report when nothing is logged yet to draw."""
    try:
        plot_sweep({a: sweep.of(a) for a in sweep.order}, result, sweep.out / "compare.png", sweep.in_loop)
        if any(r.telemetry for r in sweep.runs):
            plot_telemetry(sweep.runs, sweep.out / "compare_telemetry.png")
        if any(r.measures for r in sweep.done):
            literature_measures.plot(sweep.done, sweep.out / "compare_measures.png")
    except RunError as e:  # nothing logged yet: the tables still stand
        return f"\n(no plot: {e})"
    return ""
