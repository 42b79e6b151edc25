"""A stand-in for train_gpt2.py in the launcher tests: no torch (a run costs a Python start, not a torch import).
It writes a finished run into --out-dir in the trainer's own files (run.json, metrics.jsonl, log.txt), its final
val loss a fixed function of its options, and when it ran (started/ended) into stand_in.json."""
import json
import os
import sys
import time
from pathlib import Path

options = dict(zip(sys.argv[1::2], sys.argv[2::2]))  # --auto-resume, a flag, pairs with nothing read here
started = time.time()
out = Path(options["--out-dir"])
act, seed, n_layer = options["--act"], int(options["--seed"]), int(options.get("--n-layer", 2))
max_steps, tokens_per_step, flops_per_token = int(options.get("--max-steps", 4)), 64, 1000 * n_layer
loss = 4.0 - n_layer / 10 + (act == "relu") / 20 + seed / 100
model = {"act": act, "n_layer": n_layer, "n_embd": int(options.get("--n-embd", 32)), "n_head": 2}
config = {"model": model, "optim": {"max_steps": max_steps, "total_batch_size": tokens_per_step, "max_lr": 3e-3},
          "run": {"seed": seed}}
(out / "run.json").write_text(json.dumps({"config": config, "environment": {"flops_per_token": flops_per_token,
                                                                            "world_size": 1}}))
records = [{"step": s, "kind": "train", "loss": loss + 1, "tok_per_s": 1e4} for s in range(max_steps)]
records += [{"step": s, "kind": "eval", "val_loss": loss + (s == 0), "tokens": s * tokens_per_step,
             "flops": s * tokens_per_step * flops_per_token} for s in (0, max_steps)]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
(out / "log.txt").write_text(f"0 val {loss + 1}\n{max_steps} val {loss}\n")
if os.environ.get("SUBMITIT_EXECUTOR"):  # in a submitit job: long enough for runs started together to overlap
    time.sleep(0.4)
(out / "stand_in.json").write_text(json.dumps({"started": started, "ended": time.time()}))
