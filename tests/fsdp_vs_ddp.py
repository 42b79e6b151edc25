"""`torchrun --nproc_per_node 2 tests/fsdp_vs_ddp.py OUT.json [HELLASWAG.jsonl]` (run by tests/two_rank_runs.py's
job): tiny GPTs
trained a few steps under DDP and under --dist fsdp (train_gpt2.build_model, the trainer's own layout and meta
init) with the training loop's own pieces (no_sync_unless, step_statistics, reduce_replicated, clip_grad_norm),
for each activation and parametrization in CASES. Rank 0 writes what tests/test_fsdp.py asserts: the largest
differences of the initial weights, each step's loss and gradient norm, every gradient after the first step,
and the weights and buffers at the end; and how many rows of the tied embedding never moved. With a HellaSwag
file, the in-loop HellaSwag's scorer (eval/hellaswag.py's evaluate_model) on the same weights plain and sharded."""
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from activations import step_statistics
from eval.hellaswag import evaluate_model
from model import GPT, GPTConfig
from train_gpt2 import TrainConfig, build_model
from training import distributed, fsdp
from training.loop import NO_BUFFER_SYNC, Context, no_sync_unless
from training.optimizer import adamw

# 67 rows over 2 ranks: an uneven split of the tied embedding (34 + 33 rows)
MODEL = GPTConfig(vocab_size=67, block_size=8, n_layer=2, n_head=2, n_embd=16, base_width=8, base_depth=1)
CASES = [(act, param) for act in ("gelu", "aglu", "nswish", "swiglu") for param in ("sp", "completep")]
STEPS, MICRO, B = 2, 2, 2


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    tokens = torch.randint(0, MODEL.vocab_size, (B, MODEL.block_size + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def state(model):
    """{name: this rank's value} of every parameter (its shard, when sharded), gradient ('grad:') and buffer."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = fsdp.local_value(p.detach()).clone()
        if p.grad is not None:
            out["grad:" + name] = fsdp.local_value(p.grad).clone()
    out.update({"buffer:" + n: b.clone() for n, b in model.named_buffers()})
    return out


def train(model, train_model, d):
    """STEPS steps of MICRO accumulated micro-batches: (losses, norms, state after the first backward, at the end)"""
    optimizer = adamw(model, 3e-3, 0.1, (0.9, 0.95), 1e-8, "cpu", model.optimizer_groups(0.1, 1e-8))
    losses, norms, first = [], [], None
    for step in range(STEPS):
        total = torch.zeros(())
        for micro in range(MICRO):
            x, y = batch(step, micro, d.rank)
            with no_sync_unless(micro == MICRO - 1, train_model):
                loss = train_model(x, y)[1] / MICRO
                total += loss.detach()
                loss.backward()
        fsdp.reduce_replicated(model, d.world_size)
        step_statistics(model)
        norms.append(fsdp.clip_grad_norm(model, 0.5).item())
        losses.append(distributed.all_reduce_mean(total, d).item())
        if first is None:
            first = state(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, norms, first, state(model)


def largest_gap(whole, ours, prefix, d):
    """The largest difference over ranks (one all-reduce) between the unsharded model's values and this rank's
    shards of them (FSDP shards dim 0 as torch.chunk does), over the names that start with `prefix`."""
    names = sorted(k for k in whole if k.startswith(prefix))
    gaps = torch.zeros(len(names))
    for i, k in enumerate(names):
        expected = whole[k]
        if ours[k].shape != expected.shape:
            pieces = expected.chunk(d.world_size)
            expected = pieces[d.rank] if d.rank < len(pieces) else expected[:0]
        if expected.numel():
            gaps[i] = (expected - ours[k]).abs().max()
    dist.all_reduce(gaps, op=dist.ReduceOp.MAX)
    return {"gap": gaps.max().item(), "where": names[int(gaps.argmax())], "names": names}


def case(act, param, d, layout="fsdp"):
    config = replace(MODEL, act=act, param=param)
    torch.manual_seed(0)
    plain = GPT(config, seed=7)
    cfg = TrainConfig(model=config)
    cfg.run = replace(cfg.run, dist=layout, seed=7)
    sharded, _ = build_model(cfg, Context(d, "float32", None, None, False), None)
    start_plain, start_sharded = state(plain), state(sharded)
    ddp = train(plain, DDP(plain, **NO_BUFFER_SYNC), d)
    ours = train(sharded, sharded, d)
    moved = (ours[3]["transformer.wte.weight"] - start_sharded["transformer.wte.weight"]).abs().amax(dim=1)
    unmoved = torch.tensor([float((moved == 0).sum()), float(moved.numel())])
    dist.all_reduce(unmoved)
    return {"init": largest_gap(start_plain, start_sharded, "", d),
            "loss": max(abs(a - b) for a, b in zip(ddp[0], ours[0])), "losses": ours[0],
            "norm": max(abs(a - b) for a, b in zip(ddp[1], ours[1])),
            "grad": largest_gap(ddp[2], ours[2], "grad:", d), "end": largest_gap(ddp[3], ours[3], "", d),
            "sharded": fsdp.sharded_root(sharded) is not None,
            "embedding_shard_rows": len(moved), "rows_unmoved": int(unmoved[0]), "rows": int(unmoved[1])}


def hellaswag(path, d):
    """Both scorings of the HellaSwag file by a GPT in GPT-2's vocabulary, its rows split over the ranks: the
    model whole on each rank (DDP's in-loop evaluation) and sharded (every rank's forwards are collectives)."""
    config = replace(MODEL, vocab_size=50304, block_size=64, n_layer=1)
    torch.manual_seed(0)
    plain = GPT(config, seed=7)
    cfg = TrainConfig(model=config)
    cfg.run = replace(cfg.run, dist="fsdp", seed=7)
    cfg.eval = replace(cfg.eval, hellaswag_interval=1)  # the trainer's build accepts the in-loop HellaSwag
    sharded, _ = build_model(cfg, Context(d, "float32", None, None, False), None)
    return {name: evaluate_model(model, "cpu", data_path=path, dist_info=d, progress=False, batch_items=2)
            for name, model in (("ddp", plain), ("fsdp", sharded))}


def main(out, hellaswag_file=None):
    d = distributed.setup("cpu")
    torch.set_num_threads(1)
    try:
        results = {f"{act}/{param}": case(act, param, d) for act, param in CASES}
        # --dist hsdp with each rank a node of its own: 2 replicas of a model sharded over 1 rank (a 2-D mesh),
        # their gradients all-reduced across the replicas by FSDP; a (2, 2) mesh would take 4 processes
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        results["hsdp"] = case("aglu", "sp", d, layout="hsdp")
        os.environ["LOCAL_WORLD_SIZE"] = str(d.world_size)
        if hellaswag_file:
            results["hellaswag"] = hellaswag(hellaswag_file, d)
    finally:
        distributed.cleanup(d)
    if d.master:
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
