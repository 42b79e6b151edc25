"""The test suite against another torch, each version in a throwaway venv: one row per version for docs/install.md's
"Which torch" table (the torch, its Triton, passed / failed / skipped, what is skipped and why, what fails).

    python bench/torch_matrix.py 2.11.0 2.14.1                # a venv per version under ~/.cache/nanoact/torch_matrix
    python bench/torch_matrix.py 2.11.0 --dry-run             # the commands only, nothing installed or run
    python bench/torch_matrix.py 2.14.1 --venvs /work/venvs --workers 2 --docs docs/install.md

Per version V, in VENVS/torch-V: `python -m venv`; pip install torch==V; then requirements.txt without its torch
range and its `-e .` line (the suite runs this tree, on PYTHONPATH, not an installed copy), the Triton that torch V
pins (the newest when it pins none, as a CPU build) and wandb, as the README's test line has them; then the README's
test command from the repository root (`-n WORKERS`). The row goes to VENVS/torch-V/row.json and, with --docs, into
that file's table (a version's row replaced, the others kept). Exits 1 when a version's suite fails.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE_HEADER = "| torch | Triton | passed / failed / skipped | what is skipped, and why | what fails | measured |"
# what torch V asks of Triton, read in its venv: "triton==3.6.0; platform_system == ..." -> "triton==3.6.0"
TRITON_PIN = ('import importlib.metadata as m; print(next((r.split(";")[0].replace(" ", "") for r in '
              'm.requires("torch") or [] if r.startswith("triton")), "triton"))')


def venv_python(venv):
    return venv / "bin" / "python"


def requirements_without_torch(path):
    """requirements.txt's lines less its torch range (the venv's torch is the one under test) and `-e .`."""
    keep = [line for line in Path(path).read_text().splitlines()
            if not line.startswith(("-e", "torch>", "torch=", "torch<"))]
    return "\n".join(keep) + "\n"


def steps(version, venv, workers):
    """(what, command, environment) of each step of one version's run, in order; `{triton}` is filled in from the
    pin read in the step before it."""
    python = str(venv_python(venv))
    suite_env = {"PYTHONPATH": str(ROOT)}
    return [
        ("venv", [sys.executable, "-m", "venv", str(venv)], None),
        ("torch", [python, "-m", "pip", "install", "--quiet", f"torch=={version}"], None),
        ("pin", [python, "-c", TRITON_PIN], None),
        ("requirements", [python, "-m", "pip", "install", "--quiet", "-r", str(venv / "requirements.txt"),
                          f"torch=={version}", "{triton}", "wandb"], None),
        ("suite", [python, "-m", "pytest", "-n", str(workers), "--dist", "loadgroup", "-p", "no:cacheprovider", "-q",
                   "-rs", "--junitxml", str(venv / "junit.xml"), "tests"], suite_env),
    ]


def run_version(version, venv, workers, command):
    """Install torch `version` and the rest in `venv`, run the suite; the row's data (`command`: what was typed)."""
    venv.mkdir(parents=True, exist_ok=True)
    (venv / "junit.xml").unlink(missing_ok=True)  # an earlier run's outcomes are not this one's
    (venv / "requirements.txt").write_text(requirements_without_torch(ROOT / "requirements.txt"))
    triton, seconds = None, None
    for what, cmd, env in steps(version, venv, workers):
        if what == "venv" and venv_python(venv).exists():
            continue
        cmd = [triton if c == "{triton}" else c for c in cmd]
        print(f"[torch {version}] {what}: {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        result = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, text=True,
                                stdout=subprocess.PIPE if what == "pin" else None)
        if what == "suite":  # failures are the finding: the row says which
            seconds = round(time.time() - t0)
        elif result.returncode != 0:
            raise SystemExit(f"error: torch {version}: `{shlex.join(cmd)}` exited {result.returncode}")
        elif what == "pin":
            triton = result.stdout.strip()
    if not (venv / "junit.xml").exists():
        raise SystemExit(f"error: torch {version}: the suite wrote no {venv / 'junit.xml'}: its output above says why")
    return {"torch": installed(venv, "torch"), "triton": installed(venv, "triton"), **outcomes(venv / "junit.xml"),
            "seconds": seconds, "workers": workers, "date": datetime.date.today().isoformat(), "command": command}


def installed(venv, package):
    probe = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(venv_python(venv)), "-c", probe], capture_output=True, text=True).stdout.strip()


def outcomes(junit):
    """The suite's outcomes from its junit XML: passed (a count), failed (the tests), skipped ({reason: count})."""
    skipped, failed, passed = Counter(), [], 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            skipped[case.find("skipped").get("message", "").strip()] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}")
        else:
            passed += 1
    return {"passed": passed, "failed": failed, "skipped": dict(skipped)}


def table_row(r):
    skips = "; ".join(f"{n}: {why}" for why, n in sorted(r["skipped"].items(), key=lambda kv: -kv[1])) or "-"
    fails = ", ".join(r["failed"]) or "-"
    counts = f"{r['passed']} / {len(r['failed'])} / {sum(r['skipped'].values())}"
    cells = [r["torch"], r["triton"], counts, skips, fails,
             f"{r['date']}, `{r['command']}`: {r['seconds']} s on {r['workers']} workers"]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def update_docs(path, rows):
    """`path`'s table under TABLE_HEADER with each new row in place of its version's (the others kept), newest
    torch first."""
    lines = Path(path).read_text().splitlines()
    start = lines.index(TABLE_HEADER)
    end = start + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    table = {line.split("|")[1].strip(): line for line in lines[start + 2:end]}
    table.update({r["torch"]: table_row(r) for r in rows})
    newest_first = sorted(table, key=lambda v: [int(p) for p in v.split("+")[0].split(".")], reverse=True)
    lines[start + 2:end] = [table[v] for v in newest_first]
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("versions", nargs="+", help="torch versions, as pip takes them (2.11.0, 2.14.1)")
    p.add_argument("--venvs", default=str(Path.home() / ".cache" / "nanoact" / "torch_matrix"),
                   help="where each version's venv goes (VENVS/torch-V), kept for the next run")
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n)")
    p.add_argument("--docs", help="the markdown file whose table gets the rows (docs/install.md)")
    p.add_argument("--dry-run", action="store_true", help="print each version's commands; install and run nothing")
    args = p.parse_args(argv)
    command = shlex.join(["python", "bench/torch_matrix.py", *(sys.argv[1:] if argv is None else argv)])
    if args.docs and TABLE_HEADER not in Path(args.docs).read_text().splitlines():
        raise SystemExit(f"error: --docs {args.docs}: no table with the header {TABLE_HEADER!r}")
    rows = []
    for version in args.versions:
        venv = Path(args.venvs) / f"torch-{version}"
        if args.dry_run:
            print(f"# torch {version}: {venv}/requirements.txt is requirements.txt without its torch and -e lines; "
                  "{triton} is what the pin step prints")
            for what, cmd, env in steps(version, venv, args.workers):
                prefix = "".join(f"{k}={v} " for k, v in (env or {}).items())
                print(f"{what:13s}{prefix}{shlex.join(cmd)}")
            continue
        row = run_version(version, venv, args.workers, command)
        (venv / "row.json").write_text(json.dumps(row, indent=1) + "\n")
        print(table_row(row), flush=True)
        rows.append(row)
    if args.docs and rows:
        update_docs(args.docs, rows)
        print(f"{args.docs}: {len(rows)} row(s) written")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
