"""Training-step throughput and memory of GPT-2: a plain reference against nanoact's activations, in one run.

    python bench/train_step.py                                   # tiny CPU config: reference,gelu,aglu,nswish
    python bench/train_step.py --preset gpt2_124m --batch-size 64 --seq-len 1024 --compile   # on a GPU
    python bench/train_step.py --preset gpt2_124m --batch-size 64 --seq-len 1024 --compile \\
        --acts 'reference,gelu,gelu{"loss_chunks": 8},gelu{"attention_backend": "cudnn"}'  # one option on/off
    python bench/train_step.py --acts 'reference,aglu{"impl": "torch"},aglu{"impl": "triton"}' --compile
    python bench/train_step.py --acts gelu,swiglu --no-peak --json FILE \
        --shape '{"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256}'  # a ladder size, for --throughput FILE
    python bench/train_step.py --acts 'gelu,gelu{"vocab_size": 256}'   # GPT-2's vocabulary against bytes
    python bench/train_step.py --acts 'gelu,gelu{"pos_emb": "rope"}'   # learned positions against rotary
    python bench/train_step.py --preset gpt2_124m --batch-size 32 --seq-len 1024 --compile --acts \
        'reference,gelu,gelu{"fused_mlp": true},relu2,relu2{"fused_mlp": true},aglu,aglu{"fused_mlp": true},swiglu,\
swiglu{"fused_mlp": true}'

Contenders (--acts, comma-separated): `reference` is bench/reference_gpt2.py, the textbook GPT-2 (GELU
inline, full logits, PyTorch's SDPA choice, compile mode default). Any other name is nanoact's GPT with that
activation, optionally followed by a JSON object: its keys loss_chunks, attention_backend, compile_mode set
that contender's speed options (default: --loss-chunks, --attention-backend, --compile-mode), vocab_size its
vocabulary (default the shape's: GPT-2's, padded, 50304; 256 for byte shards, data/fineweb.py --tokenizer bytes),
pos_emb its positions (learned or rope, model.py), fused_mlp true the MLP with its activation in the matmuls
(activations/fused_mlp.py, forced as policy.py's probe would choose it; a GPU's only: on a CPU the contender is
listed as not run), every other key is an activation option passed to the
activation as is. Ratios are to the first contender. --shape (a JSON object of n_layer, n_embd, n_head, vocab_size,
block_size) replaces those of the preset: a size of a ladder plan.

Each step is forward + backward + grad clip + AdamW (the trainers' own, `training/optimizer.py`, for every
contender) on random tokens (data loading excluded). Contenders are timed in interleaved rounds (reference, gelu,
aglu, ..., reference, ...) and each reports its median, so drift of a noisy machine hits all of them alike.
Memory: what each contender holds between steps (weights, optimizer state, batches: nothing more), the bytes
autograd saves for backward in one eager forward (exact, any device), and the peak of its own steps: on CUDA
max_memory_allocated from a reset at its first measured step, less what the contenders still alive hold (each is
freed once measured), so peak ratios compare activations, and what stays allocated once it is freed (kept: ~0, or
compiled graphs hold memory); on CPU the peak RSS of a fresh process per contender. MFU: model FLOPs (6N +
attention, model.py; N of each contender's own shape, so a gated MLP counts its three matrices) over the device's
dense bf16 peak; n/a where unknown. params: each contender's parameters outside the
embeddings (a gated name, e.g. swiglu or aglu_glu, is parameter-matched to the plain MLP: activations/gated.py).
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from activations import load_fused_mlp, step_statistics
from bench.activation_speed import cpu_model
from bench.reference_gpt2 import ReferenceConfig, ReferenceGPT
from model import GPT, GPTConfig
from training.hardware import detect
from training.optimizer import adamw
from training.precision import autocast_context

PRESETS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2_124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}
SPEED_KEYS = ("loss_chunks", "attention_backend", "compile_mode")


def split_acts(text):
    """'a,b{"x": 1, "y": 2},c' -> ['a', 'b{"x": 1, "y": 2}', 'c']: commas inside braces stay."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    return [item for item in items + [current.strip()] if item]


def parse_contender(spec, args):
    """'aglu{"impl": "triton", "loss_chunks": 8}' -> dict(label, act, act_kwargs, speed options)."""
    name, _, rest = spec.partition("{")
    try:
        options = json.loads("{" + rest) if rest else {}
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: --acts entry {spec!r}: the part after the name is not a JSON object ({e})")
    name = name.strip()
    if name == "reference":  # the plain path: only its compile mode can change
        if set(options) - {"compile_mode"}:
            raise SystemExit(f"error: --acts entry {spec!r}: the reference takes only compile_mode")
        return dict(label=spec, act=name, act_kwargs={}, loss_chunks=0, attention_backend="auto",
                    compile_mode=options.get("compile_mode", "default"), vocab_size=None, pos_emb="learned")
    speed = {key: options.pop(key, getattr(args, key)) for key in SPEED_KEYS}
    return dict(label=spec, act=name, vocab_size=options.pop("vocab_size", None),
                fused_mlp=options.pop("fused_mlp", False),
                pos_emb=options.pop("pos_emb", "learned"), act_kwargs=options, **speed)


def build(args, c):
    torch.manual_seed(0)
    if c["act"] == "reference":
        model = ReferenceGPT(ReferenceConfig(**args.shape))
    else:
        config = GPTConfig(**{**args.shape, "vocab_size": c["vocab_size"] or args.shape.get("vocab_size", GPTConfig.vocab_size)}, act=c["act"],
                           act_kwargs=c["act_kwargs"], pos_emb=c["pos_emb"])
        model = GPT(config, loss_chunks=c["loss_chunks"], attention_backend=c["attention_backend"], seed=0)
        if c.get("fused_mlp"):
            load_fused_mlp()  # imported before torch.compile traces the forward (an import breaks its graph)
        for block in model.transformer.h:
            block.mlp.fused = c.get("fused_mlp", False)
    model = model.to(args.device)
    opt = adamw(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, args.device.split(":")[0])
    compiled = torch.compile(model, mode=c["compile_mode"]) if args.compile else model
    return model, compiled, opt


def make_batches(args, vocab_size=None):
    """A few random batches to rotate: never time a single cached input."""
    gen = torch.Generator().manual_seed(0)
    vocab = min(vocab_size or args.shape.get("vocab_size", 50257), 50257)
    return [torch.randint(0, vocab, (args.batch_size, args.seq_len + 1), generator=gen).to(args.device)
            for _ in range(4)]


def step_fn(args, compiled, opt, batches):
    device_type = args.device.split(":")[0]
    autocast = autocast_context(device_type, args.precision)

    def step(i):
        batch = batches[i % len(batches)]
        with autocast:
            _, loss = compiled(batch[:, :-1], batch[:, 1:])
        loss.backward()
        step_statistics(compiled)  # NSwish/NReLU: the step's running statistics, as the trainers' loop does
        torch.nn.utils.clip_grad_norm_(compiled.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device_type == "cuda":
            torch.cuda.synchronize()
    return step


@dataclass
class Runner:
    """One contender between its steps: what it holds is its weights, its optimizer state and its batches
    (held_tensors), nothing more; its step's activations and gradients are gone when the step returns."""
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    batches: list
    step: Callable[[int], None]

    def held_tensors(self):
        state = [t for s in self.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [*self.model.parameters(), *self.model.buffers(), *state, *self.batches]


def prepare(args, c):
    model, compiled, opt = build(args, c)
    batches = make_batches(args, c["vocab_size"])
    return Runner(model, opt, batches, step_fn(args, compiled, opt, batches))


def storage_bytes(tensors):
    """Bytes of the distinct storages under `tensors` (a tied weight, a view: counted once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def saved_for_backward_bytes(model, args, vocab_size):
    """Bytes autograd keeps for backward in one eager forward (deduplicated by storage): exact on any device."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        # detached: a hook that returns an output of the graph itself closes a cycle through autograd's C++
        # nodes that Python's gc cannot free, and the forward's whole graph stayed alive
        return t.detach()

    batch = torch.randint(0, min(vocab_size or args.shape.get("vocab_size", 50257), 50257),
                          (args.batch_size, args.seq_len + 1), device=args.device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_context(args.device.split(":")[0], args.precision):
            _, loss = model(batch[:, :-1], batch[:, 1:])
    del loss
    return sum(n for (ptr, _), n in seen.items() if ptr not in params)  # weights are not activation memory


def device_memory(device):
    """The device's allocator statistics (torch.cuda's), or None where torch keeps none (the CPU)."""
    module = torch.get_device_module(device)
    names = ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "empty_cache")
    return module if all(hasattr(module, name) for name in names) else None


def step_peak(runner, memory):
    """Peak bytes of this contender's own steps: what it holds plus its step's activations, gradients and
    workspace. Contenders not yet measured are alive (they were timed interleaved with it) and hold theirs
    through these steps; those bytes are taken out, so the peak is the one it would have alone."""
    others = memory.memory_allocated() - storage_bytes(runner.held_tensors())
    memory.reset_peak_memory_stats()
    for i in range(2):
        runner.step(i)
    return memory.max_memory_allocated() - others


def measure(args, c, runner, seconds, memory, plain, device_name):
    """One contender's row: its median step time, MFU, memory (held, peak of its own steps, saved for backward)."""
    tokens = args.batch_size * args.seq_len
    peak = None if args.no_peak else step_peak(runner, memory) if memory else peak_memory_child(args, c["label"])
    counted = runner.model if isinstance(runner.model, GPT) else plain  # a gated MLP's FLOPs are its own shape's
    return dict(contender=c, ms_per_step=1000 * seconds, tok_per_s=tokens / seconds,
                mfu=counted.estimate_mfu(tokens / seconds, args.seq_len, device_name), peak_bytes=peak,
                held_bytes=storage_bytes(runner.held_tensors()),
                saved_bytes=saved_for_backward_bytes(runner.model, args, c["vocab_size"]),
                params=counted.param_counts()["non_embedding"], flops_per_token=counted.flops_per_token(args.seq_len))


def peak_rss():
    """This process's peak resident memory (bytes). VmHWM, not getrusage's ru_maxrss: ru_maxrss survives
    execve, so a child started by a big parent would report the parent's peak."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_memory_child(args, spec):
    """Run a few steps of one contender in a fresh process and return its peak RSS (bytes)."""
    cmd = [sys.executable, __file__, "--child-memory", spec, "--preset", args.preset, "--shape", args.shape_text,
           "--batch-size",
           str(args.batch_size), "--seq-len", str(args.seq_len), "--device", args.device, "--warmup", str(args.warmup),
           "--loss-chunks", str(args.loss_chunks), "--attention-backend", args.attention_backend,
           "--compile-mode", args.compile_mode] + (["--compile"] if args.compile else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--acts", default="reference,gelu,aglu,nswish", help="contenders (see above)")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--shape", default="{}",
                   help="JSON object of n_layer, n_embd, n_head, vocab_size, block_size replacing the preset's")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--loss-chunks", type=int, default=0, help="nanoact contenders' default (0: off)")
    p.add_argument("--attention-backend", default="auto", help="nanoact contenders' default SDPA kernel(s)")
    p.add_argument("--compile-mode", default="default", help="nanoact contenders' default torch.compile mode")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-peak", action="store_true", help="skip the peak memory (on CPU: a process per contender)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--child-memory", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.shape_text, args.shape = args.shape, {**PRESETS[args.preset], **json.loads(args.shape)}
        unknown = set(args.shape) - {"n_layer", "n_embd", "n_head", "vocab_size", "block_size"}
    except (json.JSONDecodeError, TypeError) as e:
        raise SystemExit(f"error: --shape {args.shape!r} is not a JSON object ({e})")
    if unknown:
        raise SystemExit(f"error: --shape takes n_layer, n_embd, n_head, vocab_size, block_size; not {sorted(unknown)}")
    # bf16 autocast, as a run's --dtype auto, on GPUs that have it; float32 elsewhere (a timing without the GradScaler
    # that float16 training needs would not be a run's step)
    args.precision = "bfloat16" if args.device.startswith("cuda") and detect(args.device).bf16 else "float32"
    return args


def timed_rounds(args, contenders):
    """(runner per label, step times per label): every contender warmed up, then timed in interleaved rounds."""
    runners = {}
    for c in contenders:
        runners[c["label"]] = prepare(args, c)
        for i in range(args.warmup):  # compilation and allocator warm-up stay out of the timings
            runners[c["label"]].step(i)
    times = {label: [] for label in runners}
    for _ in range(args.rounds):
        for label, runner in runners.items():
            for i in range(args.steps):
                t0 = time.perf_counter()
                runner.step(i)
                times[label].append(time.perf_counter() - t0)
    return runners, times


def measured(args, contenders, runners, times, device_name):
    """Each contender's row (measure()), in order. Each is measured, then freed (popped from runners): the next
    one's eager forward finds its memory."""
    with torch.device("meta"):  # the reference's model FLOPs: nanoact's GPT with GPT-2's own MLP
        plain = GPT(GPTConfig(**args.shape), seed=0)
    memory = device_memory(args.device)
    results = {}
    for c in contenders:
        runner = runners.pop(c["label"])
        results[c["label"]] = measure(args, c, runner, statistics.median(times[c["label"]]), memory, plain,
                                      device_name)
        del runner
        if memory is not None:  # what stays allocated once it is freed, beyond what the others hold: ~0
            memory.empty_cache()
            results[c["label"]]["kept_bytes"] = memory.memory_allocated() - storage_bytes(
                [t for r in runners.values() for t in r.held_tensors()])
    return results


def print_table(args, results, device_name):
    """The rows, with ratios to the first contender."""
    base_label = next(iter(results))
    base = results[base_label]
    shape = f" {args.shape_text}" if args.shape_text != "{}" else ""
    print(f"preset {args.preset}{shape} | B={args.batch_size} T={args.seq_len} | device {device_name or args.device} | "
          f"compile {args.compile} | {args.precision} | median of {args.rounds}x{args.steps} steps"
          f" | torch {torch.__version__}")
    width = max(len(label) for label in results)
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f}"
    ratio = lambda a, b: "n/a" if a is None or b is None else f"{a / b:.3f}"
    print(f"{'contender':{width}s} {'params*':>9s} {'ms/step':>9s} {'tok/s':>10s} {'MFU':>6s} {'held MiB':>9s} {'peak MiB':>9s} "
          f"{'saved MiB':>9s} {'tok/s ratio':>11s} {'peak ratio':>10s}   (ratios to {base_label}; *outside embeddings)")
    for label, r in results.items():
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{label:{width}s} {r['params']:9,d} {r['ms_per_step']:9.1f} {r['tok_per_s']:10.0f} {mfu:>6s} "
              f"{mib(r['held_bytes']):>9s} {mib(r['peak_bytes']):>9s} "
              f"{r['saved_bytes'] / 2**20:9.1f} {r['tok_per_s'] / base['tok_per_s']:11.3f} "
              f"{ratio(r['peak_bytes'], base['peak_bytes']):>10s}")


def main(argv=None):
    args = parse_args(argv)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.child_memory:
        runner = prepare(args, parse_contender(args.child_memory, args))
        for i in range(args.warmup + 2):
            runner.step(i)
        print(peak_rss())
        return
    contenders = [parse_contender(spec, args) for spec in split_acts(args.acts)]
    if not args.device.startswith("cuda"):
        for c in [c for c in contenders if c.get("fused_mlp")]:
            print(f"{c['label']}: not run, the fused MLP (Triton) runs only on a GPU ({args.device} here)")
            contenders.remove(c)
    labels = [c["label"] for c in contenders]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"error: --acts lists a contender twice: {args.acts}")
    runners, times = timed_rounds(args, contenders)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    results = measured(args, contenders, runners, times, device_name)
    print_table(args, results, device_name)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "shape": args.shape,
                                               "device": device_name or f"{cpu_model()}, {torch.get_num_threads()} threads",
                                               "torch": torch.__version__,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
