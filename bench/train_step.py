"""Training-step throughput and memory of GPT-2 per activation, measured in one run so ratios are fair.

    python bench/train_step.py                                   # tiny CPU config, gelu/aglu/nswish
    python bench/train_step.py --preset gpt2_124m --batch-size 64 --seq-len 1024 --compile   # on a GPU

Each step is forward + backward + AdamW on random tokens (data loading excluded). Activations are timed in
interleaved rounds (gelu, aglu, nswish, gelu, ...) and each reports its median, so drift of a noisy machine
hits all of them alike. Memory: the bytes autograd saves for backward in one eager forward (exact, any
device), and the peak: CUDA max_memory_allocated, or on CPU the peak RSS of a fresh process per activation.
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from training.precision import autocast_context
from model import GPT, GPTConfig

PRESETS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2_124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


def build(args, act):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**PRESETS[args.preset], act=act)).to(args.device)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), 1e-8, args.device.split(":")[0])
    return model, (torch.compile(model) if args.compile else model), opt


def step_fn(args, compiled, opt):
    device_type = args.device.split(":")[0]
    autocast = autocast_context(device_type, "bfloat16" if args.bf16 else "float32")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50257, (args.batch_size, args.seq_len + 1), generator=gen).to(args.device)
               for _ in range(4)]  # rotate a few batches: never time a single cached input

    def step(i):
        batch = batches[i % len(batches)]
        with autocast:
            _, loss = compiled(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(compiled.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device_type == "cuda":
            torch.cuda.synchronize()
    return step


def saved_for_backward_bytes(model, args):
    """Bytes autograd keeps for backward in one eager forward (deduplicated by storage): exact on any device."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    batch = torch.randint(0, 50257, (args.batch_size, args.seq_len + 1), device=args.device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_context(args.device.split(":")[0], "bfloat16" if args.bf16 else "float32"):
            _, loss = model(batch[:, :-1], batch[:, 1:])
    del loss
    return sum(n for (ptr, _), n in seen.items() if ptr not in params)  # weights are not activation memory


def peak_memory_child(args, act):
    """Run a few steps of one activation in a fresh process and return its peak RSS (bytes)."""
    cmd = [sys.executable, __file__, "--child-memory", act, "--preset", args.preset, "--batch-size", str(args.batch_size),
           "--seq-len", str(args.seq_len), "--device", args.device] + (["--compile"] if args.compile else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--acts", default="gelu,aglu,nswish")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--child-memory", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.bf16 = args.device.startswith("cuda")
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True

    if args.child_memory:
        model, compiled, opt = build(args, args.child_memory)
        step = step_fn(args, compiled, opt)
        for i in range(args.warmup + 2):
            step(i)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux reports KiB
        return

    acts = args.acts.split(",")
    runners = {}
    for act in acts:
        model, compiled, opt = build(args, act)
        runners[act] = (model, step_fn(args, compiled, opt))
        for i in range(args.warmup):  # compilation and allocator warm-up stay out of the timings
            runners[act][1](i)
    times = {act: [] for act in acts}
    for _ in range(args.rounds):
        for act in acts:
            step = runners[act][1]
            for i in range(args.steps):
                t0 = time.perf_counter()
                step(i)
                times[act].append(time.perf_counter() - t0)

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    tokens = args.batch_size * args.seq_len
    results = {}
    for act in acts:
        model = runners[act][0]
        dt = statistics.median(times[act])
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            for i in range(2):
                runners[act][1](i)
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = peak_memory_child(args, act)
        mfu = model.estimate_mfu(tokens / dt, args.seq_len, device_name)
        results[act] = dict(ms_per_step=1000 * dt, tok_per_s=tokens / dt, mfu=mfu, peak_bytes=peak,
                            saved_bytes=saved_for_backward_bytes(model, args))

    base = results[acts[0]]
    print(f"preset {args.preset} | B={args.batch_size} T={args.seq_len} | device {device_name or args.device} | "
          f"compile {args.compile} | {'bf16' if args.bf16 else 'fp32'} | median of {args.rounds}x{args.steps} steps")
    print(f"{'act':8s} {'ms/step':>9s} {'tok/s':>10s} {'MFU':>6s} {'peak MiB':>9s} {'saved MiB':>9s} "
          f"{'tok/s vs ' + acts[0]:>14s} {'peak vs ' + acts[0]:>12s} {'saved vs ' + acts[0]:>13s}")
    for act, r in results.items():
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{act:8s} {r['ms_per_step']:9.1f} {r['tok_per_s']:10.0f} {mfu:>6s} {r['peak_bytes'] / 2**20:9.0f} "
              f"{r['saved_bytes'] / 2**20:9.1f} {r['tok_per_s'] / base['tok_per_s']:14.3f} "
              f"{r['peak_bytes'] / base['peak_bytes']:12.3f} {r['saved_bytes'] / base['saved_bytes']:13.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "device": device_name or args.device,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
