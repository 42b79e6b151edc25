"""HellaSwag evaluation throughput (items/s) of eval/hellaswag.py, both scorings, eager vs torch.compile.

    python bench/hellaswag.py --limit 256 --n-layer 2 --n-embd 64        # CPU, small random model
    python bench/hellaswag.py --checkpoint log/gelu --modes eager,compiled  # on a GPU, all 10,042 items

Random weights are fine for speed (the work does not depend on them). Compiled mode first runs one
all-padding batch per length bucket, so the timed pass measures steady state and the compile time is
reported on its own. Times exclude tokenization (reported separately).
"""
import argparse
import json
import time
from pathlib import Path

import torch

from data.tokenizer import gpt2_tokenizer
from eval.hellaswag import build_requests, download, evaluate_model, load_items
from eval.scoring import bucket, row_length, score_rows
from model import GPT, GPTConfig
from training.checkpoint import load_gpt
from training.distributed import pick_device
from training.precision import autocast_context, resolve_precision

SHARED = Path(__file__).resolve().parents[2] / "shared" / "assets" / "hellaswag" / "hellaswag_val.jsonl"


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warm_up(model, lengths, batch_items, device, autocast):
    """One all-padding batch per length bucket: every compile happens here, untimed."""
    t0 = time.time()
    for length in lengths:
        score_rows(model, [], length, 4 * batch_items, device, autocast)
    sync(device)
    return time.time() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a nanoact checkpoint (default: random weights of the given size)")
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=None, help="default: n_embd // 64 (at least 1)")
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--data", help=f"HellaSwag jsonl (default: {SHARED} if present, else the download cache)")
    p.add_argument("--limit", type=int)
    p.add_argument("--batch-items", type=int, default=32)
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    autocast = autocast_context(device.split(":")[0], resolve_precision(args.dtype, device.split(":")[0]))
    data = args.data or (SHARED if SHARED.is_file() else download())
    items = load_items(data, args.limit)
    enc = gpt2_tokenizer()
    t0 = time.time()
    requests = [r for scoring in ("completion", "lm_eval") for r in build_requests(enc, items, scoring)]
    tokenize_s = time.time() - t0

    if args.checkpoint:
        base, _ = load_gpt(args.checkpoint, device)
    else:
        torch.manual_seed(0)
        base = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head or max(1, args.n_embd // 64),
                             n_embd=args.n_embd)).to(device).eval()
    report = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
              "threads": torch.get_num_threads(), "params_M": round(base.num_params() / 1e6, 2),
              "n_layer": base.config.n_layer, "n_embd": base.config.n_embd, "items": len(items),
              "batch_items": args.batch_items, "dtype": args.dtype, "tokenize_s_both": round(tokenize_s, 2),
              "modes": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "modes"}))
    block = base.config.block_size
    lengths = sorted({bucket(max(row_length(ctx, c, block) for c in conts), block) for ctx, conts, _ in requests})
    for mode in args.modes.split(","):
        model = torch.compile(base, dynamic=False) if mode == "compiled" else base
        warm_s = warm_up(model, lengths, args.batch_items, device, autocast)
        sync(device)
        results = evaluate_model(model, device, data, args.limit, "both", None, autocast, True, args.batch_items)
        sync(device)
        row = {"warmup_s": round(warm_s, 2), "buckets": lengths}
        for scoring, r in results.items():
            row[scoring] = {"seconds": round(r["seconds"], 2), "items_per_s": round(r["n"] / r["seconds"], 1),
                            "acc": r["acc"], "acc_norm": r["acc_norm"]}
        row["both_seconds"] = round(sum(r["seconds"] for r in results.values()), 2)
        report["modes"][mode] = row
        print(mode, json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
