"""Forward+backward time and bytes saved for backward of every registered activation at the
GPT-2 MLP shape (rows x 3072), eager and torch.compile'd, with ratios to GELU from the same run.

    python bench/activation_speed.py                                  # CPU 2048x3072 fp32 (+ CUDA 65536x3072 bf16 if present)
    python bench/activation_speed.py --device cuda --rows 65536 --dtype bfloat16 --json out.json
    python bench/activation_speed.py --device cpu --acts gelu,aglu --rows 64 --rounds 1   # two of them, toy size

On a GPU a second table times GPT-2's whole MLP (rows x 768 -> 3072 -> 768, compiled) per activation that has a
fused form: the compiler's activation, its elementwise kernel where it has one, and activations/fused_mlp.py, with
the matmuls' achieved FLOP/s and the hidden tensor's bandwidth as fractions of the device's peaks (bench_mlp).

The parametric activations (AGLU, APA, NSwish, NReLU) run once per implementation: `torch` (the
PyTorch path) and, on CUDA with Triton, `triton` (the fused kernels of activations/kernels.py); the
last column compares every row with compiled GELU, the measure of the GPU target (BENCHMARKS.md,
"Fused Triton kernels vs the PyTorch path"). Timings are medians over rounds; each round times every
case once, in turn, so a transient load on a shared machine hits all of them alike. Parametric modules
run in training mode (NSwish/NReLU update their running statistics, as in a training step); the backward
computes the input gradient and every parameter gradient.
"""
import argparse
import datetime
import inspect
import json
import os
import platform
import statistics
import sys
import time

import torch

import activations
from activations import selfcheck
from activations.impl import loaded_kernels

WIDTH = 3072  # GPT-2 small MLP hidden size, 4 * 768


def unique_names():
    """Registered names, one per class (swish is silu)."""
    seen, names = set(), []
    for name in activations.available():
        cls = type(activations.build(name))
        if cls not in seen:
            seen.add(cls)
            names.append(name)
    return names


def variants(impls, names):
    """(name, impl) pairs: the fixed activations once (impl None), the parametric ones per impl."""
    out = []
    for name in names:
        takes_impl = "impl" in inspect.signature(type(activations.build(name)).__init__).parameters
        out += [(name, impl) for impl in impls] if takes_impl else [(name, None)]
    return out


def build(name, impl):
    return activations.build(name, **({"impl": impl} if impl else {}))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def saved_bytes(fn, x):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return total


def step(fn, module, x, grad):
    out = fn(x)
    return torch.autograd.grad(out, [x, *module.parameters()], grad)


def bench_device(device, rows, dtype, rounds, warmup, impls, names, backend="inductor"):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.randn(rows, WIDTH, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(rows, WIDTH, device=device, dtype=dtype)
    cases = {}
    for name, impl in variants(impls, names):
        module = build(name, impl).to(device)
        cases[(name, impl, "eager")] = (module, module)
        compiled = build(name, impl).to(device)
        cases[(name, impl, "compiled")] = (torch.compile(compiled, backend=backend), compiled)
    for fn, module in cases.values():  # warm-up, and compilation, outside the timings
        for _ in range(warmup):
            step(fn, module, x, grad)
    sync()
    times = {key: [] for key in cases}
    for _ in range(rounds):
        for key, (fn, module) in cases.items():
            sync()
            t0 = time.perf_counter()
            step(fn, module, x, grad)
            sync()
            times[key].append(time.perf_counter() - t0)
    results = []
    for name, impl in variants(impls, names):
        row = {"name": name, "impl": impl}
        for mode in ("eager", "compiled"):
            fn, module = cases[(name, impl, mode)]
            row[f"{mode}_ms"] = 1e3 * statistics.median(times[(name, impl, mode)])
            row[f"{mode}_ms_min"] = 1e3 * min(times[(name, impl, mode)])
            row[f"{mode}_saved_bytes"] = saved_bytes(fn, x)
        results.append(row)
    gelu = next(r for r in results if r["name"] == "gelu")
    for row in results:
        for key in ("eager_ms", "eager_ms_min", "compiled_ms", "compiled_ms_min", "eager_saved_bytes", "compiled_saved_bytes"):
            row[key + "_x_gelu"] = row[key] / gelu[key]
        row["best_ms_x_gelu_compiled"] = min(row["eager_ms"], row["compiled_ms"]) / gelu["compiled_ms"]
    return results


def peak_bandwidth(device):
    """Bytes/s of the GPU's memory (double data rate: 2 x clock x bus width), or None where torch does not say."""
    props = torch.cuda.get_device_properties(device)
    clock, bus = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    return 2 * clock * 1e3 * bus / 8 if clock and bus else None


def bench_mlp(device, rows, dtype, rounds, warmup, names, d_model=768):
    """The MLP's fwd+bwd, compiled, per activation with a fused form (activations/fused_mlp.py), and SwiGLU's (the
    ladder's gated arm, activations/gated.py's width): the compiler's activation, the elementwise kernel (where the
    activation has one) and the fused MLP, interleaved. Each row: ms, matmul TFLOP/s (the matmuls' 6 rows d width
    FLOPs each, fwd+bwd) and its fraction of the dense bf16 peak (model.py's PEAK_FLOPS), and the hidden tensor's
    traffic in GB/s with its fraction of the memory's peak: the fused MLP's passes of rows x width (plain: pre and
    h written, pre read, grad_pre and h written, 5; gated: up too, 8), the floor an unfused MLP moves more than."""
    from activations.gated import hidden_width
    from model import PEAK_FLOPS
    fused_mlp = activations.load_fused_mlp()
    name_of_device = torch.cuda.get_device_name(device)
    peak_flops = next((f for key, f in PEAK_FLOPS if key in name_of_device), None)
    bandwidth = peak_bandwidth(device)
    x = torch.randn(rows, d_model, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(rows, d_model, device=device, dtype=dtype)
    cases, shapes = {}, {}
    for setting in [*names, "swiglu"]:
        name, gated = activations.mlp_activation(setting)
        takes_impl = "impl" in inspect.signature(type(activations.build(name)).__init__).parameters
        if fused_mlp.fused_kind(build(name, "torch" if takes_impl else None))[0] is None:
            continue
        shapes[setting] = (hidden_width(d_model, WIDTH, gated), 3 if gated else 2, 8 if gated else 5)
        for arm, impl, fused in (("compiler", "torch" if takes_impl else None, False),
                                 *((("kernel", "triton", False),) if takes_impl else ()),
                                 ("fused", "torch" if takes_impl else None, True)):
            mlp = selfcheck.MLP(build(name, impl), d_model, shapes[setting][0], gated).to(device, dtype)
            mlp.fused = fused
            cases[(setting, arm)] = (torch.compile(mlp), mlp)
    for fn, module in cases.values():
        for _ in range(warmup):
            step(fn, module, x, grad)
    torch.cuda.synchronize()
    times = {key: [] for key in cases}
    for _ in range(rounds):
        for key, (fn, module) in cases.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(fn, module, x, grad)
            torch.cuda.synchronize()
            times[key].append(time.perf_counter() - t0)
    results = []
    for (name, arm), t in times.items():
        seconds = statistics.median(t)
        width, matmuls, passes = shapes[name]
        flops = 6 * matmuls * rows * d_model * width / seconds
        traffic = passes * rows * width * torch.finfo(dtype).bits / 8 / seconds
        results.append({"name": name, "arm": arm, "ms": 1e3 * seconds, "tflops": flops / 1e12,
                        "flops_fraction": flops / peak_flops if peak_flops else None, "hidden_gbs": traffic / 1e9,
                        "bandwidth_fraction": traffic / bandwidth if bandwidth else None})
    return results


def print_mlp_table(name, rows, dtype, results):
    print(f"\n{name}  MLP {rows}x768 -> {WIDTH} (gated: 2048) -> 768 {str(dtype).replace('torch.', '')}, compiled, "
          "fwd+bwd: ms (ratio to the compiler's arm), matmul TFLOP/s (fraction of the dense peak), hidden tensor GB/s "
          "(fraction of peak)")
    frac = lambda f: "n/a" if f is None else f"{f:.2f}"
    base = {r["name"]: r["ms"] for r in results if r["arm"] == "compiler"}
    for r in results:
        print(f"{r['name'] + ' [' + r['arm'] + ']':<22}{r['ms']:>8.3f} ({r['ms'] / base[r['name']]:.3f})"
              f"{r['tflops']:>9.1f} ({frac(r['flops_fraction'])}){r['hidden_gbs']:>9.0f} ({frac(r['bandwidth_fraction'])})")


def print_table(device, rows, dtype, results):
    print(f"\n{device}  {rows}x{WIDTH} {str(dtype).replace('torch.', '')}  fwd+bwd ms: median (ratio to gelu, same "
          "mode), min-ratio = ratio of the fastest rounds; best/gelu-c = faster mode / compiled gelu; "
          "saved for backward: MiB (ratio to gelu)")
    head = (f"{'activation':<20}{'eager ms':>14}{'min-ratio':>10}{'compiled ms':>15}{'min-ratio':>10}"
            f"{'best/gelu-c':>12}{'saved eager':>15}{'saved compiled':>16}")
    print(head)
    print("-" * len(head))
    for r in results:
        label = f"{r['name']} [{r['impl']}]" if r["impl"] else r["name"]
        print(f"{label:<20}{r['eager_ms']:>7.1f} ({r['eager_ms_x_gelu']:.2f}){r['eager_ms_min_x_gelu']:>10.2f}"
              f"{r['compiled_ms']:>8.1f} ({r['compiled_ms_x_gelu']:.2f}){r['compiled_ms_min_x_gelu']:>10.2f}"
              f"{r['best_ms_x_gelu_compiled']:>12.2f}"
              f"{r['eager_saved_bytes'] / 2**20:>8.1f} ({r['eager_saved_bytes_x_gelu']:.2f})"
              f"{r['compiled_saved_bytes'] / 2**20:>9.1f} ({r['compiled_saved_bytes_x_gelu']:.2f})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all", help="all: cpu, and cuda when available")
    p.add_argument("--rows", type=int, help="default 2048 on cpu, 65536 on cuda")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="default float32 on cpu, bfloat16 on cuda")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--impl", help="comma-separated implementations of the parametric activations; default "
                   "torch on cpu, torch,triton on cuda with Triton (triton on cpu needs TRITON_INTERPRET=1)")
    p.add_argument("--acts", help="comma-separated activations (default: one name per registered class); gelu, "
                   "the base of every ratio, always runs")
    p.add_argument("--backend", default="inductor", help="the compiled column's compiler (aot_eager generates no code: "
                   "a smoke run's, its timings no measure)")
    p.add_argument("--json", metavar="OUT", help="write the results here")
    args = p.parse_args()
    asked = [a for a in (args.acts or "").split(",") if a and a != "gelu"]
    names = ["gelu", *asked] if args.acts else unique_names()

    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    if args.device == "cuda" and not devices:
        p.error("no CUDA device")
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "backend": args.backend,
        "loadavg_before": os.getloadavg()[0],
        "runs": [],
    }
    for device in devices:
        rows = args.rows or (65536 if device == "cuda" else 2048)
        dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
        triton = ["triton"] if device == "cuda" and loaded_kernels() else []
        impls = args.impl.split(",") if args.impl else ["torch", *triton]
        results = bench_device(device, rows, dtype, args.rounds, args.warmup, impls, names, args.backend)
        name = device if device == "cpu" else torch.cuda.get_device_name()
        print_table(name, rows, dtype, results)
        mlp = []
        if device == "cuda" and loaded_kernels():
            mlp = bench_mlp(device, rows, dtype, args.rounds, args.warmup, names)
            print_mlp_table(name, rows, dtype, mlp)
        else:
            print(f"\n{name}: the fused MLP (activations/fused_mlp.py, Triton) runs only on a GPU: not measured here")
        report["runs"].append({"device": device, "device_name": name, "rows": rows, "dtype": str(dtype),
                               "results": results, "mlp": mlp})
    report["loadavg_after"] = os.getloadavg()[0]
    print(f"\nload average (1 min) before / after: {report['loadavg_before']:.2f} / {report['loadavg_after']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
