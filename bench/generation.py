"""Generation speed of GPT.generate (what sample.py runs), with and without the KV cache.

    python bench/generation.py --threads 2                              # CPU: GPT-2 124M shape, random weights
    python bench/generation.py --device cuda --dtype bfloat16 --new-tokens 512
    python bench/generation.py --checkpoint log/aglu --prompt-tokens 64

Random weights are fine for speed (the work does not depend on them). Without the cache every new token
reruns the whole context; with it the prompt runs once and then one token per step. Each mode is warmed
up with a short run, then timed over --rounds runs (median reported), with the same seed: both modes sample
the same tokens (checked), so they do the same work apart from the cache.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.device_options import add_device_options, device_and_autocast
from model import GPT, GPTConfig
from training.checkpoint import load_checkpoint


def timed_generate(model, prompt, new_tokens, use_cache, device, autocast):
    generator = torch.Generator(device=device).manual_seed(0)
    t0 = time.perf_counter()
    with autocast:
        out = model.generate(prompt, new_tokens, top_k=1, generator=generator, use_cache=use_cache)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a checkpoint (default: random weights of the given size)")
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--batch", type=int, default=1, help="samples generated together")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    add_device_options(p)
    args = p.parse_args(argv)
    device, autocast = device_and_autocast(args)
    if args.checkpoint:
        model = GPT.from_checkpoint(load_checkpoint(args.checkpoint, kind="gpt2"), device)
    else:
        model = GPT(GPTConfig(n_layer=args.n_layer, n_head=max(1, args.n_embd // 64), n_embd=args.n_embd), seed=0)
        model = model.to(device).eval()
    torch.manual_seed(0)
    prompt = torch.randint(0, 50257, (args.batch, args.prompt_tokens), device=device)
    report = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
              "threads": torch.get_num_threads(), "params_M": round(model.num_params() / 1e6, 2),
              "batch": args.batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "dtype": args.dtype, "modes": {}}
    outputs = {}
    for name, use_cache in (("kv_cache", True), ("no_cache", False)):
        timed_generate(model, prompt, 4, use_cache, device, autocast)
        runs = [timed_generate(model, prompt, args.new_tokens, use_cache, device, autocast) for _ in range(args.rounds)]
        seconds = statistics.median(s for s, _ in runs)
        outputs[name] = runs[0][1]
        report["modes"][name] = {"seconds": round(seconds, 3),
                                 "tok_per_s": round(args.batch * args.new_tokens / seconds, 1)}
        print(name, json.dumps(report["modes"][name]), flush=True)
    report["same_tokens"] = bool(torch.equal(outputs["kv_cache"], outputs["no_cache"]))
    report["speedup"] = round(report["modes"]["no_cache"]["seconds"] / report["modes"]["kv_cache"]["seconds"], 2)
    print(json.dumps({k: v for k, v in report.items() if k != "modes"}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
