"""What compiling the translation trainer's step costs: the whole model in one graph per batch shape (nanoact before
2026-11-26) against each encoder and decoder layer compiled once (training/regional_compile.py, what the trainer does).

    python bench/translation_compile.py                         # CPU: inductor's C++ backend, 6L-6L d 512 NSwish
    python bench/translation_compile.py --device cuda           # a GPU: the same tables
    python bench/translation_compile.py --skip-steps            # only the graph counts
    python bench/translation_compile.py --skip-graphs --ways whole,layers_dynamic --steps 1   # only the steps
    python bench/translation_compile.py --train-prefix PREFIX --vocab 64 --layers 1 --rows 2 --length 8 \
        --ways layers_dynamic --steps 1 --backend eager  # every part at toy size (tests the script itself)

1. Graphs over one epoch of real batches: the IWSLT 2016 sample (../shared/assets/iwslt, or --train-prefix), sentencepiece
   --vocab, pairs of <= 50 pieces, batches of 4096 tokens padded to multiples of 8 (the trainer's compiled
   batches). Dynamo's counters under backend "eager" (dynamo's graphs are the same whatever backend compiles them
   afterwards) on a model of the default depth made narrow (d 64, token ids folded into 512) so a CPU walks the
   epoch in minutes.
2. The first compiled step: one padded batch (--rows x --length: pairs of one padded shape, as gpu_check's)
   through the default model (vocab --vocab), forward and backward, each way in its own process with an empty
   inductor cache, forked from one that imported torch and dynamo and did nothing else (a fresh process but for the
   imports: nothing compiled, no thread started, no lazy import done); then --steps eager and compiled steps
   interleaved (A B A B) in that process: target tokens/s and the compiled loss against the eager one on the same
   batch (dropout 0, so they are the same computation).
   Both models start from init seed 0 (the weights every figure in BENCHMARKS.md was measured with).
"""
import argparse
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from data.parallel_corpus import TokenBatchLoader, encode, load_sentencepiece, load_split, sentencepiece_model
from training.loop import allow_recompiles
from training.regional_compile import RegionallyCompiled, compiled_graphs, warm_up
from translation.model import Transformer, TranslationConfig

SAMPLE = Path(__file__).resolve().parents[1] / "../shared/assets/iwslt/iwslt16_train_sample/train_sample_19689"
# how the step's model is compiled: the whole model with static shapes (the trainer's --compile before 2026-11-26),
# each layer with static shapes (one graph per padded length), each layer with dynamic shapes (the trainer now)
WAYS = ("whole", "layers_static", "layers_dynamic")
FOLD = 512  # the epoch's token ids modulo this vocabulary: graphs depend on shapes, not ids; the output layer is cheap


def compile_way(way, model, backend):
    if way == "whole":
        return torch.compile(model, dynamic=False, backend=backend)
    return RegionallyCompiled(model, dynamic=way == "layers_dynamic", backend=backend)


def model_config(args, **kw):
    return TranslationConfig(vocab_size=args.vocab, act=args.act, dropout=args.dropout, enc_layers=args.layers,
                             dec_layers=args.layers, **kw)


def epoch_graphs(args, way, loader):
    """(graphs compiled in the warm-up, graphs compiled during the epoch, seconds of the epoch) for one way."""
    torch._dynamo.reset()
    counters.clear()
    model = Transformer(dataclasses.replace(model_config(args, d_model=64, ffn_dim=128), vocab_size=FOLD),
                        seed=0).train()
    compiled = compile_way(way, model, backend="eager")
    warmed, epoch_start = 0, time.perf_counter()
    if way == "whole":
        allow_recompiles(loader.shapes() + 1)
    else:
        warmed = warm_up(compiled, model, loader.padded_shapes(), contextlib.nullcontext(), torch.device("cpu"))[1]
        epoch_start = time.perf_counter()
    before = compiled_graphs()
    for _ in range(len(loader)):
        x, y_in, y_out = (t % FOLD for t in loader.next_batch())
        model.loss(compiled(x, y_in), y_out).backward()
        model.zero_grad(set_to_none=True)
    return warmed, compiled_graphs() - before, time.perf_counter() - epoch_start


def graphs_table(args):
    src, tgt = load_split("train", "de", "en", prefix=args.train_prefix)
    sp = load_sentencepiece(sentencepiece_model(src, tgt, args.vocab, "bpe", args.spm_dir))
    ids = encode(sp, src, tgt, 50)
    print(f"\n{Path(args.train_prefix).name}: {len(ids[0])} pairs, {args.vocab}-piece vocabulary; a {args.layers}L-{args.layers}L "
          f"d 64 {args.act} model, backend eager\n")
    print("| compiled | padded shapes | batches | graphs in the warm-up | graphs during the epoch |\n|---|---|---|---|---|")
    for way in args.ways.split(","):
        loader = TokenBatchLoader(*ids, args.max_tokens, seed=0, pad_multiple=8)
        warmed, during, _ = epoch_graphs(args, way, loader)
        print(f"| {way} | {loader.shapes()} | {len(loader)} | {warmed} | {during} |", flush=True)


def one_way(args, way):
    """In a process that compiled nothing: the first compiled step, then eager and compiled steps interleaved."""
    device = torch.device(args.device)
    model = Transformer(model_config(args), seed=0).to(device).train()
    compiled = compile_way(way, model, args.backend)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, args.vocab, (args.rows, args.length), generator=g).to(device)
    tgt = torch.randint(4, args.vocab, (args.rows, args.length), generator=g).to(device)

    def step(fn):
        start, cpu = time.perf_counter(), cpu_seconds()
        loss = model.loss(fn(src, tgt), tgt)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, loss.item(), cpu_seconds() - cpu

    first, compiled_loss, first_cpu = step(compiled)
    graphs = compiled_graphs()
    eager_s, compiled_s, loss_diff = [], [], 0.0
    for _ in range(args.steps):
        seconds, eager_loss, _ = step(model)
        eager_s.append(seconds)
        seconds, compiled_loss, _ = step(compiled)
        compiled_s.append(seconds)
        loss_diff = max(loss_diff, abs(compiled_loss - eager_loss) / abs(eager_loss))
    tokens = args.rows * args.length
    speed = {"eager_tok_s": tokens / statistics.median(eager_s), "compiled_tok_s": tokens / statistics.median(compiled_s),
             "loss_rel_diff": loss_diff} if args.steps else {}
    return {"way": way, "params": model.num_params(), "first_step_s": first, "first_step_cpu_s": first_cpu,
            "graphs": graphs, **speed}


def forked(work):
    """go() runs work() in a child forked now and waits for it (its exit code): fork before anything compiles or
    starts a thread (OpenMP's pool, CUDA), and the child starts from this process's imports alone. Without go()
    (an error before it), the child leaves when this process does."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        code = 0
        try:
            if os.read(read, 1):
                work()
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(read)

    def go():
        sys.stdout.flush()
        os.write(write, b"1")
        os.close(write)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return go


def first_steps(args, way):
    """one_way's results from a child of this process (which compiles nothing) with an empty inductor cache."""
    import torch._inductor.config

    with tempfile.TemporaryDirectory() as tmp:  # nothing compiled before, by this way or another
        result = Path(tmp) / "result.json"

        def run():
            os.environ.update(TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TORCHINDUCTOR_COMPILE_THREADS="1")
            torch._inductor.config.compile_threads = 1  # inductor read the environment when dynamo imported it
            result.write_text(json.dumps(one_way(args, way)))
        if forked(run)():
            raise SystemExit(f"{way}: its first step failed (the error above)")
        return json.loads(result.read_text())


def cpu_seconds():
    """CPU seconds of this process and of the compilers it waited for (inductor's g++, one compile thread)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def steps_table(args):
    """Run in a process that compiled nothing and ran no torch op (its children are forked from it)."""
    for n, way in enumerate(args.ways.split(",")):
        r = first_steps(args, way)
        if n == 0:  # the parameter count comes from the first child: this process builds no model
            print(f"\nfirst compiled step: {r['params'] / 1e6:.2f}M parameters, {args.layers}L-{args.layers}L d 512 "
                  f"{args.act}, one batch of {args.rows} x {args.length} tokens, {args.device}, backend {args.backend}; "
                  f"then {args.steps} eager and compiled steps interleaved\n")
            print("| compiled | first step (s) | its CPU-s | graphs | eager tgt tok/s | compiled tgt tok/s | "
                  "compiled / eager | loss rel. diff |\n|---|---|---|---|---|---|---|---|")
        speed = (f"{r['eager_tok_s']:.0f} | {r['compiled_tok_s']:.0f} | {r['compiled_tok_s'] / r['eager_tok_s']:.2f}x | "
                 f"{r['loss_rel_diff']:.1e}") if args.steps else "- | - | - | -"
        print(f"| {way} | {r['first_step_s']:.1f} | {r['first_step_cpu_s']:.1f} | {r['graphs']} | {speed} |", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--act", default="nswish")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--spm-dir", default="/tmp/nanoact_spm")
    p.add_argument("--train-prefix", default=str(SAMPLE), help="the epoch's pairs: PREFIX.de and PREFIX.en")
    p.add_argument("--backend", default="inductor", help="the steps' compiler (eager: dynamo alone, no code generated)")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--skip-steps", action="store_true")
    p.add_argument("--skip-graphs", action="store_true")
    args = p.parse_args(argv)
    steps = None if args.skip_steps else forked(lambda: steps_table(args))  # its ways forked before any compile
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}")
    if not args.skip_graphs:
        graphs_table(args)
    if steps and steps():
        raise SystemExit(1)  # the steps table's error is above


if __name__ == "__main__":
    main()
