"""What a sweep will cost, before anything runs: training FLOPs per run, per size and in all, and GPU-hours
where a throughput is known.

FLOPs of a run: model.py's flops_per_token (6N plus the attention scores, the count MFU uses) x total_batch_size x
max_steps, for the model each run's options build (a meta-device model: nothing is allocated). GPU-hours: those
FLOPs at the FLOP/s one GPU reached, per activation, from bench/train_step.py --json FILE (--throughput) or else
from the finished runs of the same sweep (their median tok/s x flops_per_token / world size). Measured at one size,
it is assumed at every size: the rate scales with model FLOPs, as MFU roughly stays put across GPT-2 sizes on one
GPU type. An arm nobody measured takes the slowest measured rate: an estimate of cost should not undercount.
"""
import json
import statistics
from pathlib import Path

from analysis.runs import RunError, finished, load_run, markdown_table
from errors import ConfigError
from sweep.plan import trainer_config


def gpt2_costs(config, options, world_size, cache):
    """(activation, training FLOPs, GiB per GPU under --dist ddp, under fsdp, the run's own --dist) of one GPT-2 run
    with these trainer options on `world_size` ranks; the memory is train_gpt2.py's estimate (training/memory.py) at
    the run's micro-batch."""
    import torch

    from model import GPT
    from train_gpt2 import memory_estimates, memory_shape

    if tuple(options) in cache:
        return cache[tuple(options)]
    cfg = trainer_config("gpt2", ["--config", config, *options])
    shape = repr(cfg.model)  # a size's runs differ in seed and lr: their model is built once
    if shape not in cache:
        with torch.device("meta"):
            cache[shape] = GPT(cfg.model, seed=cfg.run.init_seed), memory_shape(cfg.model)
    model, memory = cache[shape]
    flops = model.flops_per_token(cfg.optim.seq_len) * cfg.optim.total_batch_size * cfg.optim.max_steps
    estimates = memory_estimates(cfg, world_size, memory)
    cache[tuple(options)] = (cfg.model.act, flops, estimates["ddp"].total / 2 ** 30, estimates["fsdp"].total / 2 ** 30,
                             cfg.run.dist)
    return cache[tuple(options)]


def rerun_text(trainer, config, again, runs):
    """The plan's rerun_refuted, before the audit has said which arms it clears: the most it can add, `again` (every
    arm's ladder runs above the lr grid's size, run once more) over all the plan's `runs` [(size, options)]."""
    if trainer != "gpt2" or not again:
        return f"rerun_refuted: up to {len(again)} more runs if the tuning audit clears no arm"
    cache = {}
    try:
        more, total = (sum(gpt2_costs(config, options, 1, cache)[1] for _, options in group) for group in (again, runs))
    except ConfigError as e:
        return f"rerun_refuted: up to {len(again)} more runs; FLOPs not counted: {e}"
    return (f"rerun_refuted: up to {len(again)} more runs, {more:.3g} training FLOPs ({more / total:.1%} on top of "
            "the total above) if the tuning audit clears no arm: each arm it does not clear runs again at every size "
            "above the lr grid's")


def bench_rates(paths):
    """{act: FLOP/s per GPU} and where they come from, from bench/train_step.py --json files."""
    rates, devices = {}, set()
    for path in paths:
        try:
            bench = json.loads(Path(path).read_text())
            for result in bench["results"].values():
                rates[result["contender"]["act"]] = result["tok_per_s"] * result["flops_per_token"]
            devices.add(bench.get("device") or "?")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"--throughput {path}: not a bench/train_step.py --json file ({e})") from None
    return rates, f"bench/train_step.py on {', '.join(sorted(devices))}"


def run_rates(directories):
    """{act: FLOP/s per GPU}: the median over the finished runs in these sweep directories."""
    seen = {}
    for directory in directories:
        for path in sorted(p for p in Path(directory).iterdir() if p.is_dir()):
            if not finished(path):
                continue
            try:
                run = load_run(path)
                environment = json.loads((path / "run.json").read_text())["environment"]
                per_gpu = (statistics.median(run.tok_per_s) * environment["flops_per_token"]
                           / environment.get("world_size", 1))
            except (RunError, OSError, ValueError, KeyError, TypeError, statistics.StatisticsError):
                continue
            seen.setdefault(run.setting("act"), []).append(per_gpu)
    return {act: statistics.median(values) for act, values in seen.items()}, "the finished runs of this sweep"


def cost_text(trainer, config, runs, rates, source, world_size=1, stages=None):
    """The cost lines of runs [(size or None, trainer options)] on `world_size` ranks each: FLOPs, GPU-hours and
    the memory per GPU under DDP and FSDP (training/memory.py), the larger of each size's runs; stages: each run's
    stage ("lr grid", "ladder", "tuning audit"), for a line with the lr stage's share, or None."""
    if trainer != "gpt2":
        return f"cost: {len(runs)} runs; FLOPs are counted for the GPT-2 trainer only"
    cache, per_size, per_stage = {}, {}, {}
    for i, (size, options) in enumerate(runs):
        try:
            act, flops, ddp, fsdp, dist = gpt2_costs(config, options, world_size, cache)
        except ConfigError as e:  # the trainer says it again, in its own words, when the run starts
            return f"cost: {len(runs)} runs; FLOPs not counted: {e}"
        rate = rates.get(act, min(rates.values())) if rates else None
        row = per_size.setdefault(size or "all", [0, 0.0, 0.0, 0.0, 0.0, set()])
        row[0] += 1
        row[1] += flops
        row[2] += flops / rate / 3600 if rate else 0.0
        row[3], row[4] = max(row[3], ddp), max(row[4], fsdp)
        row[5].add(dist)
        if stages:
            per_stage[stages[i]] = per_stage.get(stages[i], 0.0) + flops
    total = [sum(row[i] for row in per_size.values()) for i in range(3)]
    hours = lambda h: f"{h:,.1f}" if rates else "not measured"
    rows = [[size, n, f"{flops / n:.3g}", f"{flops:.3g}", hours(h), f"{ddp:,.1f}", f"{fsdp:,.1f}", ",".join(sorted(d))]
            for size, (n, flops, h, ddp, fsdp, d) in per_size.items()]
    rows.append(["total", total[0], "", f"{total[1]:.3g}", hours(total[2]), "", "", ""])
    if rates:
        speed = ", ".join(f"{act} {rate:.3g}" for act, rate in sorted(rates.items()))
        note = f"GPU-hours at the FLOP/s per GPU of {source} ({speed}), scaled with model FLOPs"
    else:
        note = ("GPU-hours: not measured; pass --throughput FILE (bench/train_step.py --json on the target GPU) or "
                "finish some runs of this plan")
    note += (f"\nGiB/GPU: training/memory.py's estimate of parameters, gradients, AdamW state and one micro-batch's "
             f"activations per GPU on {world_size} ranks a run, under --dist ddp and fsdp (dist: the runs' own); a "
             "run that cannot fit its GPU refuses to start, in one line")
    lr_stage = {k: v for k, v in per_stage.items() if k != "ladder"}
    shares = (f"\nthe lr stage: {sum(lr_stage.values()):.3g} FLOPs, {sum(lr_stage.values()) / total[1]:.1%} of the "
              "total (" + ", ".join(f"{k} {v / total[1]:.1%}" for k, v in lr_stage.items()) + ")") if lr_stage else ""
    return (f"cost: {total[0]} runs, {total[1]:.3g} training FLOPs (model.py's flops_per_token x tokens)\n"
            + markdown_table(["size", "runs", "FLOPs/run", "FLOPs", "GPU-hours", "GiB/GPU ddp", "GiB/GPU fsdp",
                              "dist"], rows) + f"\n{note}{shares}")
