"""SASS instructions per element of every Triton kernel variant of activations/kernels.py, compiled for a GPU
target with no GPU present (Triton's bundled ptxas and cuobjdump), with registers and spills.

    python bench/kernel_instructions.py                   # sm_80 and sm_90, the working tree's kernels
    python bench/kernel_instructions.py --commit a84bf53  # the kernels.py of a commit (before/after)
    python bench/kernel_instructions.py --json 80 90 100  # one JSON row per variant (tests/test_kernels.py)
    python bench/kernel_instructions.py 80 --kernels _apa_kernel --dtypes fp32   # one kernel's variants
    python bench/kernel_instructions.py 80 90 100 --fused      # activations/fused_mlp.py's matmul: every config x
                                                               # activation x pass, registers and spills

The kernels are straight-line code (no loops): each thread handles BLOCK / (32 num_warps) elements, unrolled, so
the static SASS count divided by that is the instructions issued per element, the program's fixed work (loads
of the parameters, the block reductions) spread over its elements. Precise division and libdevice's slow paths
count in full (they are in the code even when rarely taken). A kernel waits on issue, not on memory, once its
instructions per element exceed (SMs x lanes x clock) x (bytes per element) / (memory bandwidth): bf16 moves 4
bytes per element forward and 6 backward (the thresholds for an H200 and an H100:
BENCHMARKS.md, "The learned activations' kernels"). MUFU instructions (ex2, rcp, lg2) go through a pipe an eighth as wide
(16 lanes per SM), counted apart: 3 per element cost about as much as 24 others.
"""
import argparse
import importlib.util
import itertools
import json
import os
import struct
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # before triton's first import: compile, do not interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what a GPU run compiles with (fma contraction)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
FLAGS = list(itertools.product((True, False), repeat=2))
IO = ("x_ptr", "z_ptr", "grad_ptr", "out_ptr", "a_ptr", "b_ptr", "b2_ptr", "bias_ptr", "bias2_ptr", "pre_ptr", "up_ptr",
      "out2_ptr", "h_ptr")  # the tensors in the activation's dtype; the rest are fp32
NOP, MUFU = 0x918, 0x308  # SASS opcodes (sm_70 to sm_90; cuobjdump -sass counts the same on every variant here)


@triton.jit
def _copy(x_ptr, y_ptr):
    tl.store(y_ptr, tl.load(x_ptr))


def load_kernels(commit=None):
    """activations/kernels.py of the working tree, or of `commit` (git show), as a module of its own."""
    path = ROOT / "activations" / "kernels.py"
    if commit:
        text = subprocess.run(["git", "show", f"{commit}:activations/kernels.py"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
        path = Path(tempfile.mkdtemp()) / "kernels_at_commit.py"
        path.write_text(text)
    spec = importlib.util.spec_from_file_location("kernels_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants(K):
    """(kernel, scalar args, constexprs, options) of every launch kernels.py makes. anact_rows' BLOCK is any
    power of two up to MAX_ROW, with kernels.row_warps(block) warps: those with the same values per thread compile
    to the same per-thread code, so the largest of each count stands for its class (16 from 512 to 4096, 32)."""
    for gated, backward in FLAGS:
        yield K._apa_kernel, {"n": "i32", "lam_min": "fp32"}, dict(GATED=gated, BACKWARD=backward, BLOCK=K.BLOCK), {}
    for swish in (True, False):
        yield K._anact_stats_kernel, {"n": "i32"}, dict(SWISH=swish, BLOCK=K.STATS_BLOCK), {"num_warps": K.STATS_WARPS}
    row_warps = getattr(K, "row_warps", lambda block: min(max(block // 256, 1), 8))  # a84bf53's kernels.py
    for swish, backward in FLAGS:
        yield K._anact_kernel, {"n": "i32"}, dict(SWISH=swish, BACKWARD=backward, BLOCK=K.BLOCK), {}
        for block in (4096, K.MAX_ROW):
            yield (K._anact_rows_kernel, {"n_cols": "i32", "eps": "fp32"}, dict(SWISH=swish, BACKWARD=backward,
                   BLOCK=block), {"num_warps": row_warps(block)})


def fused_variants(largest_only=False, kinds=None):
    """(kernel, scalar args, constexprs, options) of activations/fused_mlp.py's matmul: every autotune config (or the
    one with the largest tile, the most registers), every activation, forward and backward, plain and gated. The matmul's SASS is a
    loop, not straight-line code: its rows report registers and spills, per_element only as the epilogue's bound."""
    import activations.fused_mlp as fused
    import activations.pointwise as pointwise
    largest = lambda configs: [max(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_warps))]
    scalars = {"lam_min": "fp32", **{k: "i32" for k in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk",
                                                          "stride_bn")}}
    kinds = kinds or sorted(set(pointwise.KINDS) - {"swish"})
    for name, backward, gated in itertools.product(kinds, (False, True), (False, True)):
        configs = fused._prune(fused.CONFIGS, {}, KIND=pointwise.KINDS[name], GATED=gated, BACKWARD=backward)
        for config in largest(configs) if largest_only else configs:
            yield (fused._matmul_act_kernel.fn, scalars,
                   dict(KIND=pointwise.KINDS[name], BACKWARD=backward, GATED=gated, HAS_BIAS=not backward,
                        SAVE_PRE=not backward, IEEE=False, **config.kwargs),
                   {"num_warps": config.num_warps, "num_stages": config.num_stages})


def compile_one(fn, scalars, constexprs, options, dtype, arch):
    pointers = [a for a in fn.arg_names if a.endswith("_ptr")]
    signature = {**{p: f"*{dtype}" if p in IO else "*fp32" for p in pointers}, **scalars,
                 **{c: "constexpr" for c in constexprs}}
    # what a launch specializes on: 16-byte aligned tensors and, as at every GPT-2 shape, sizes divisible by 16
    aligned = [i for i, a in enumerate(fn.arg_names) if a in pointers or scalars.get(a) == "i32"]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


def sass_counts(cubin, name):
    """(SASS instructions, MUFU instructions) in the cubin's code of kernel `name`, read from its ELF .text section
    without a disassembler (cheaper than a cuobjdump -sass process per cubin): since Volta every instruction is 16 bytes,
    its opcode the low 12 bits. The NOPs padding the end are left out."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<I20xQQ", cubin, shoff + i * entsize) for i in range(count)]  # name, offset, size
    strtab = sections[names][1]
    for name_at, offset, size in sections:
        if cubin[strtab + name_at:cubin.index(b"\0", strtab + name_at)] == f".text.{name}".encode():
            opcodes = [struct.unpack_from("<Q", cubin, at)[0] & 0xFFF for at in range(offset, offset + size, 16)]
            return sum(op != NOP for op in opcodes), sum(op == MUFU for op in opcodes)
    raise ValueError(f"no .text.{name} section in the cubin")


def usage(kernel, name):
    """The cubin's resource usage (cuobjdump -res-usage: {"REG": 56, "STACK": 0, "LOCAL": 0, ...}), its SASS
    instructions and the MUFU ones among them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    line = next(line for line in out.splitlines() if "REG:" in line)
    found = {k: int(v) for k, v in (item.split(":", 1) for item in line.split() if ":" in item and "[" not in item)}
    sass, mufu = sass_counts(kernel.asm["cubin"], name)
    return {**found, "sass": sass, "mufu": mufu}


def arch_rows(arch, commit=None, dtypes=("bf16", "fp32"), kernels=None, fused=False):
    """One row per (variant, dtype) for sm_`arch`: usage() and instructions per element, or the error. kernels: the
    names of the kernels to count (default all); fused: fused_mlp.py's variants instead of kernels.py's."""
    try:  # is this arch one the installed Triton (and its ptxas) targets at all?
        compile_one(_copy, {}, {}, {}, "fp32", arch)
    except Exception as e:  # noqa: BLE001 - reported as the row: an arch this Triton has no backend for
        return [{"arch": arch, "unsupported": f"{type(e).__name__}: {e}"[:300]}]
    rows = []
    for fn, scalars, constexprs, options in fused_variants() if fused else variants(load_kernels(commit)):
        if kernels and fn.__name__ not in kernels:
            continue
        block = constexprs.get("BLOCK") or constexprs["BLOCK_M"] * constexprs["BLOCK_N"]
        per_thread = block // (32 * options.get("num_warps", 4))
        for dtype in dtypes:
            row = {"arch": arch, "kernel": fn.__name__, "dtype": dtype, **constexprs, **options}
            try:
                row.update(usage(compile_one(fn, scalars, constexprs, options, dtype, arch), fn.__name__))
                row["per_element"] = round(row["sass"] / per_thread, 1)
                row["mufu_per_element"] = round(row["mufu"] / per_thread, 2)
            except Exception as e:  # noqa: BLE001 - reported as the row, for the caller to fail on
                row["error"] = f"{type(e).__name__}: {e}"[:1000]
            rows.append(row)
    return rows


def toolchain():
    """None, or why no cubin can be disassembled here."""
    missing = [name for name in ("ptxas", "cuobjdump") if not (BIN / name).is_file()]
    return f"Triton {triton.__version__} bundles no {', '.join(missing)} in {BIN}" if missing else None


def label(row):
    flags = [k.lower() for k in ("GATED", "SWISH", "BACKWARD") if row.get(k)]
    block = f" BLOCK={row['BLOCK']}" if row["kernel"] == "_anact_rows_kernel" else ""
    if "KIND" in row:
        from activations.pointwise import KINDS
        kinds = {v: k for k, v in reversed(KINDS.items())}
        block = f" {kinds[row['KIND']]} {row['BLOCK_M']}x{row['BLOCK_N']}x{row['BLOCK_K']} s{row['num_stages']}"
    return f"{row['kernel']}[{','.join(flags) or '-'}]{block}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archs", nargs="*", type=int, default=[80, 90], help="sm_XY targets, e.g. 80 90 100")
    p.add_argument("--commit", help="count the kernels.py of this commit instead of the working tree's")
    p.add_argument("--dtypes", default="bf16", help="comma-separated: bf16, fp32, fp16")
    p.add_argument("--json", action="store_true", help="one JSON row per variant (bf16 and fp32)")
    p.add_argument("--kernels", help="comma-separated kernel names, e.g. _apa_kernel (default: every kernel)")
    p.add_argument("--fused", action="store_true", help="activations/fused_mlp.py's matmul variants instead")
    args = p.parse_args(argv)
    missing = toolchain()
    if missing and args.json:  # for tests/test_kernels.py to skip on, saying why
        print(json.dumps({"unavailable": missing}))
        return
    if missing:
        raise SystemExit(f"error: {missing}; reinstall triton (pip install triton) to count instructions")
    dtypes = ("bf16", "fp32") if args.json else tuple(args.dtypes.split(","))
    kernels, n = args.kernels and args.kernels.split(","), len(args.archs)
    with ProcessPoolExecutor(min(2, n)) as pool:
        results = list(pool.map(arch_rows, args.archs, [args.commit] * n, [dtypes] * n, [kernels] * n,
                                [args.fused] * n))
    rows = [row for arch in results for row in arch]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"Triton {triton.__version__}, kernels.py of {args.commit or 'the working tree'}: SASS instructions per "
          f"element, of which MUFU (registers, spill bytes)")
    for row in rows:
        if "unsupported" in row or "error" in row:
            print(f"sm_{row['arch']}: {row.get('unsupported') or row['error']}")
            continue
        spills = row["STACK"] + row["LOCAL"]
        print(f"sm_{row['arch']} {row['dtype']:<4} {label(row):<45} {row['per_element']:6.1f} "
              f"{row['mufu_per_element']:5.2f}  "
              f"({row['REG']} registers{f', {spills} bytes spilled' if spills else ''})")
    if failed := sum("error" in row for row in rows):
        raise SystemExit(f"error: {failed} of {len(rows)} variants did not compile")


if __name__ == "__main__":
    main()
