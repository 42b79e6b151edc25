"""Start many of the project's commands cheaply: each `python SCRIPT ARGS` (or `python -m MODULE ARGS`) runs in a
child forked from one `python -c` that has imported torch and nothing of the project, so torch's import (~2 CPU-s)
is paid once, not per command. The child sets what `python SCRIPT` sets (sys.path[0] the script's folder, or the
current directory for -m; sys.argv; __main__); an uncaught exception's traceback and SystemExit's message are in its
stderr as they would be."""
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FORK_PER_RUN = r"""
import gc, importlib, json, os, runpy, signal, sys
runs, preload, later, limit, finalize = json.loads(sys.argv[1])
for module in preload:
    importlib.import_module(module)
gc.freeze()
for n, (target, args, after) in enumerate(runs):
    for module in later if after else ():
        importlib.import_module(module)
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(str(n) + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        signal.alarm(limit)  # a command that hangs ends by SIGALRM, its status -14
        try:
            if target.startswith("-m "):
                sys.path[0], sys.argv = os.getcwd(), [target[3:], *args]
                runpy.run_module(target[3:], run_name="__main__", alter_sys=True)
            else:
                sys.path[0], sys.argv = os.path.dirname(os.path.abspath(target)), [target, *args]
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code
        if finalize and finalize in sys.modules:
            sys.exit(code)
        if code is not None and not isinstance(code, int):  # what SystemExit("message") does
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code or 0)
    _, status, usage = os.wait4(pid, 0)
    with open(f"{n}.status", "w") as f:
        f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.2f}")
"""


@dataclass
class Started:
    status: int
    cpu_s: float  # the child's and its own children's CPU-seconds, torch's import not included
    out: str
    err: str

    def __str__(self):
        return f"exit {self.status} after {self.cpu_s} CPU-s\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def run_forked(runs, cwd, preload=("torch",), limit=120, env=None, finalize=None, later=((), ())):
    """{name: Started} of runs {name: (script path or "-m module", [args])}, one after another in cwd (their
    output there as N.out, N.err, N.status); each ended after `limit` seconds. `preload`: modules the parent
    imports once for all (each command imports what it imports either way: this only saves the time).
    later: (modules, names): the parent imports these modules once the other runs are done, then starts the runs
    named (the commands that import them anyway); they are not frozen (gc.freeze()), so what they leave is freed at
    a command's exit as in a fresh process (Triton's bindings report what is not: "nanobind: leaked ...").
    finalize: a module (e.g. "triton"); a command that imported it ends through the interpreter's exit, as the
    command would, so that what prints at exit (atexit, the module's finalizers) is in its stderr: 0.3-1 CPU-s a
    command with torch loaded. The others end by os._exit once their output is flushed (an uncaught exception
    still ends through the interpreter's exit)."""
    cwd, (modules, after) = Path(cwd), later
    names = sorted(runs, key=lambda name: name in after)  # stable: the others first, in their order
    subprocess.run([sys.executable, "-c", FORK_PER_RUN,
                    json.dumps([[[*runs[name], name in after] for name in names], preload, modules, limit,
                                finalize or ""])],
                   cwd=cwd, env=env, check=True, timeout=limit * len(runs) + 60)
    done = {}
    for n, name in enumerate(names):
        status, cpu = (cwd / f"{n}.status").read_text().split()
        done[name] = Started(int(status), float(cpu), (cwd / f"{n}.out").read_text(), (cwd / f"{n}.err").read_text())
    return {name: done[name] for name in runs}
