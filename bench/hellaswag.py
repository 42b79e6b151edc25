"""HellaSwag evaluation time of eval/hellaswag.py (both scorings in one pass), eager vs torch.compile.

    python bench/hellaswag.py --limit 256 --n-layer 2 --n-embd 64        # CPU, small random model
    python bench/hellaswag.py --checkpoint log/gelu --modes eager,compiled  # on a GPU, all 10,042 items

Random weights are fine for speed (the work does not depend on them). Reported apart: tokenizing both
scorings (what the token cache on disk saves), reading them back from that cache, packing the distinct
rows into batches, the compile warm-up (one all-padding batch per batch length, so the timed pass is steady
state, as every in-loop call after the first), and the scoring pass itself with its number of forwards.
The first call's CPU seconds (all threads) are reported too: on a shared machine they vary less than its wall time.
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.device_options import add_device_options, device_and_autocast
from data.tokenizer import EOT
from eval import hellaswag
from eval.scoring import score_batch
from model import GPT, GPTConfig
from training.checkpoint import load_checkpoint

SHARED = Path(__file__).resolve().parents[2] / "shared" / "assets" / "hellaswag" / "hellaswag_val.jsonl"


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warm_up(model, lengths, batch_rows, device, autocast):
    """One all-padding batch per batch length: every compile happens here, untimed."""
    t0 = time.time()
    for length in lengths:
        idx = torch.full((batch_rows, length), EOT, device=device)
        score_batch(model, idx, torch.full_like(idx, -1), autocast, greedy=False)
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
    add_device_options(p)
    args = p.parse_args(argv)
    device, autocast = device_and_autocast(args)
    data = args.data or (SHARED if SHARED.is_file() else hellaswag.download())
    items = hellaswag.load_items(data, args.limit)
    gold = torch.tensor([item["label"] for item in items])
    t0 = time.time()
    requests = hellaswag.tokenize(items, hellaswag.SCORINGS, cache=False)
    tokenize_s = time.time() - t0
    with tempfile.TemporaryDirectory() as tmp:
        hellaswag.save_requests(Path(tmp) / "tokens.npz", requests)
        t0 = time.time()
        hellaswag.load_requests(Path(tmp) / "tokens.npz", hellaswag.SCORINGS)
        cached_s = time.time() - t0

    if args.checkpoint:
        base = GPT.from_checkpoint(load_checkpoint(args.checkpoint, kind="gpt2"), device)
    else:
        base = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head or max(1, args.n_embd // 64),
                             n_embd=args.n_embd), seed=0).to(device).eval()
    report = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
              "threads": torch.get_num_threads(), "params_M": round(base.num_params() / 1e6, 2),
              "n_layer": base.config.n_layer, "n_embd": base.config.n_embd, "items": len(items),
              "batch_items": args.batch_items, "dtype": args.dtype, "tokenize_s_both": round(tokenize_s, 2),
              "token_cache_load_s": round(cached_s, 2), "modes": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "modes"}))
    batch_rows = 4 * args.batch_items
    for mode in args.modes.split(","):
        model = torch.compile(base, dynamic=False) if mode == "compiled" else base
        t0 = time.time()
        packing = hellaswag.make_row_batches(requests, gold, base.config.block_size, batch_rows,
                                   length_step=hellaswag.length_step(model))
        pack_s = time.time() - t0
        lengths = sorted({idx.shape[1] for _, idx, _ in packing.batches})
        warm_s = warm_up(model, lengths, batch_rows, device, autocast)
        hellaswag._ROW_BATCHES.clear()  # the first call of a run: reads, tokenizes and packs (timed apart below)
        t0, cpu0 = time.time(), time.process_time()
        results = hellaswag.evaluate_model(model, device, data, args.limit, "both", None, autocast, True,
                                           args.batch_items)
        sync(device)
        call_s, call_cpu_s = time.time() - t0, time.process_time() - cpu0
        r = results["completion"]
        row = {"pack_s": round(pack_s, 2), "warmup_s": round(warm_s, 2), "batch_lengths": lengths,
               "rows": r["rows"], "rows_total": 8 * len(items), "forwards": r["forwards"],
               "pass_seconds": round(r["seconds"], 2), "items_per_s": round(len(items) / r["seconds"], 1),
               "first_call_seconds": round(call_s, 2), "first_call_cpu_s": round(call_cpu_s, 2)}
        for scoring, res in results.items():
            row[scoring] = {"acc": res["acc"], "acc_norm": res["acc_norm"]}
        report["modes"][mode] = row
        print(mode, json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
