"""The README's two commands timed against each other: its test command with cold caches and its main job (the
shards, then the tiny run), alternated, so that the ratio is measured on one machine in one sitting.

    python bench/readme_ratio.py --pairs 2
    python bench/readme_ratio.py --dry-run       # the commands it would time, run nothing

Cold: every __pycache__ of the tree deleted, inductor's /tmp/torchinductor_$USER removed, and new empty
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and NANOACT_CACHE. The job prepares its shards from ../shared's offline
text when it is there (docs/install.md), else streams FineWeb-Edu as the README does. The project asks for the tests
to take at most twice the job.
"""
import argparse
import getpass
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT.parent / "shared" / "assets" / "text"


def timed(cmd, env, log):
    t0 = time.perf_counter()
    code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - t0, code


TESTS = [sys.executable, "-m", "pytest", "-n", "auto", "--dist", "loadgroup", "tests", "-q", "-p", "no:cacheprovider"]


def job_commands(work):
    """The README job's two commands, its files under work: the shards, then the tiny run."""
    source = (["--input", str(TEXT / "tinyshakespeare.txt"), *map(str, sorted((TEXT / "c4_sample").glob("*.json.gz"))),
               *map(str, sorted((TEXT / "wikitext2").glob("*.txt")))] if TEXT.is_dir() else
              ["--streaming", "--max-docs", "2000"])
    shards = [sys.executable, "data/fineweb.py", *source, "--shard-size", "1e6", "--out", str(work / "tiny_shards")]
    train = [sys.executable, "train_gpt2.py", "--config", "configs/gpt2_cpu_tiny.toml", "--act", "aglu",
             "--data-dir", str(work / "tiny_shards"), "--out-dir", str(work / "run")]
    return shards, train


def cold_tests(env, log):
    for cache in ROOT.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}", ignore_errors=True)
    fresh = {name: tempfile.mkdtemp() for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "NANOACT_CACHE")}
    return timed(TESTS, {**env, **fresh}, log)


def readme_job(env, log):
    shards, train = job_commands(Path(tempfile.mkdtemp()))
    seconds, code = timed(shards, env, log)
    if code == 0:
        more, code = timed(train, env, log)
        seconds += more
    return seconds, code


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=1, help="tests then job, this many times (default 1)")
    p.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "readme_ratio.log"),
                   help="both commands' output (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the commands each pair times, run nothing")
    args = p.parse_args()
    if args.dry_run:
        for name, cmd in (("tests (cold caches)", TESTS), *zip(("job: shards", "job: run"), job_commands(Path("WORK")))):
            print(f"{name}: {shlex.join(cmd)}")
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ratios = []
    with open(args.log, "w") as log:
        for pair in range(args.pairs):
            tests, test_code = cold_tests(env, log)
            job, job_code = readme_job(env, log)
            ratios.append(tests / job)
            print(f"pair {pair + 1}: tests {tests:.1f} s (exit {test_code}), job {job:.1f} s (exit {job_code}): "
                  f"{tests / job:.2f}x", flush=True)
    print(f"median {statistics.median(ratios):.2f}x over {len(ratios)} pair(s) (at most 2x asked); output in "
          f"{args.log}")


if __name__ == "__main__":
    main()
