"""What keeping HellaSwag item by item costs: writing, reading and comparing two items files of the full validation
set (eval/hellaswag_items.py, eval/compare_items.py), with both scorings.

    python bench/hellaswag_items.py                 # 10,042 items, synthetic log-likelihoods

The scores are random (the cost does not depend on them): 4 log-likelihoods and divisors per item and scoring,
as eval/hellaswag.py writes them. Writing happens once per evaluation on rank 0 (the others wait for it at the
end of a run); reading and comparing happen when a user compares two runs or the sweep report reads its runs.
"""
import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from eval import compare_items, hellaswag_items


def records(n, labels, seed):
    rng = random.Random(seed)
    for i in range(n):
        yield {"i": i, "label": labels[i], **{
            name: hellaswag_items.scoring_record([-rng.uniform(20, 200) for _ in range(4)],
                                                 [float(rng.randint(lo, hi)) for _ in range(4)])
            for name, lo, hi in (("completion", 3, 40), ("lm_eval", 15, 200))}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=10042)
    args = p.parse_args(argv)
    labels = [random.Random(0).randrange(4) for _ in range(args.items)]
    header = {"n": args.items, "scorings": ["completion", "lm_eval"]}
    with tempfile.TemporaryDirectory() as tmp:
        paths, write_s = [Path(tmp) / f"hellaswag_items_{k:05d}.jsonl.gz" for k in (1, 2)], []
        for seed, path in enumerate(paths):
            rows = list(records(args.items, labels, seed))  # made before the clock: eval/hellaswag.py has them
            t0 = time.perf_counter()
            hellaswag_items.write(path, header, rows)
            write_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        a, b = hellaswag_items.read(paths[0]), hellaswag_items.read(paths[1])
        read_s = (time.perf_counter() - t0) / 2
        t0 = time.perf_counter()
        rows = compare_items.compare(a, b)
        compare_s = time.perf_counter() - t0
        result = {"items": args.items, "file_mb": paths[0].stat().st_size / 1e6, "write_s": min(write_s),
                  "read_s": read_s, "compare_s": compare_s, "comparisons": len(rows),
                  "discordant": [r["discordant"] for r in rows]}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
