"""Imports point down (README, "The code"): a folder imports only the folders below it, so a reader can follow
any module to the bottom without meeting the trainer that uses it, and the loop never depends on a model."""
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# room -> the rooms it may import, lowest first; a room not listed here (scripts, bench/) may import anything.
# errors.py, the project's error types, is below every room; stats/ (numpy and scipy) is the lowest above it.
# analysis/ reads what runs wrote, never a trainer; sweep/, what runs where, is the top room: it starts the trainers.
BELOW = {
    "errors": set(),
    "stats": {"errors"},
    "activations": {"errors"},
    "data": {"errors"},
    "training": {"errors", "activations", "data"},
    "model_parts": {"errors"},
    "model": {"errors", "activations", "model_parts"},
    "translation": {"errors", "activations", "data"},
    "eval": {"errors", "stats", "activations", "data", "training", "model_parts", "model", "translation"},
    "export": {"errors", "stats", "activations", "data", "training", "model_parts", "model", "eval"},
    "analysis": {"errors", "stats", "activations", "data", "model_parts", "model", "training", "eval"},
    "sweep": {"errors", "stats", "activations", "data", "model_parts", "model", "training", "translation", "eval",
              "analysis", "train_gpt2", "train_translation"},
}
# what evaluations and exports may take from training/: reading checkpoints (and, to run under torchrun on
# the device the trainers use, the process group and precision helpers), the in-loop evaluations' contract
# (training/in_loop.py), never the loop
TRAINING_FOR = {
    "eval": {"training.checkpoint", "training.distributed", "training.precision", "training.in_loop"},
    "export": {"training.checkpoint"},
    "sweep": {"training.config"},  # a plan's config and options read as the trainer reads them
    "analysis": {"training.in_loop"},  # the readers: the Metric records a run declares
}
ROOMS = set(BELOW) | {"bench", "sample", "train_gpt2", "train_translation"}


def imports(source):
    """The project names a file imports, dotted (a from-import of a room names the room's module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield from (f"{node.module}.{alias.name}" if node.module in ROOMS else node.module
                        for alias in node.names)


def violations(files):
    """One line per forbidden import in (path relative to the root, source) pairs."""
    found = []
    for rel, source in files:
        room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if room not in BELOW:
            continue
        for name in imports(source):
            target = name.split(".")[0]
            if target not in ROOMS or target == room:
                continue
            if target not in BELOW[room]:
                found.append(f"{rel} imports {name}: {room} may import only {sorted(BELOW[room])}")
            elif target == "training" and room in TRAINING_FOR and \
                    not any(name == m or name.startswith(m + ".") for m in TRAINING_FOR[room]):
                found.append(f"{rel} imports {name}: {room} may take from training/ only {sorted(TRAINING_FOR[room])}")
    return found


def test_imports_point_down():
    files = [(path.relative_to(ROOT), path.read_text()) for path in sorted(ROOT.rglob("*.py"))]
    assert len(files) > 50 and violations(files) == []


def test_the_rule_catches_an_upward_import():
    """The check itself: a loop that imports the model, and an evaluation that imports the loop, are reported;
    an evaluation that reads checkpoints is not."""
    files = [(Path("training/x.py"), "from model import GPT\n"),
             (Path("eval/y.py"), "import torch\nfrom training.loop import Trainer\n"),
             (Path("eval/z.py"), "from training.checkpoint import load_checkpoint\nfrom model import GPT\n")]
    assert [v.split(":")[0] for v in violations(files)] == ["training/x.py imports model.GPT",
                                                           "eval/y.py imports training.loop"]


def module_graph(folder):
    """{module: the modules of `folder` it imports}, counting importlib.import_module("...") by name too (how the
    circle activations/impl.py -> selfcheck.py -> aglu.py -> impl.py used to hide)."""
    graph = {}
    # a package inside the folder (sweep/launchers/) is one module of it, its files' imports together
    for path in sorted([*(ROOT / folder).glob("*.py"), *(ROOT / folder).glob("*/__init__.py")]):
        source = path.read_text() if path.name != "__init__.py" or path.parent == ROOT / folder else \
            "\n".join(p.read_text() for p in sorted(path.parent.glob("*.py")))
        path = path if path.parent == ROOT / folder else path.parent
        named = {n.args[0].value for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "import_module"
                 and n.args and isinstance(n.args[0], ast.Constant)}
        targets = set()
        for name in {*imports(source), *named}:
            parts = name.split(".")
            if parts[0] == folder:
                module = parts[1] if len(parts) > 1 and ((ROOT / folder / f"{parts[1]}.py").is_file() or
                                                         (ROOT / folder / parts[1] / "__init__.py").is_file()) \
                    else "__init__"
                targets.add(module)
        graph[path.stem] = targets - {path.stem}
    return graph


def cycle(graph):
    """One import cycle of the graph as a list of modules, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, trail + [nxt])):
                return found
        state[node] = "done"
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node, [node]))), None)


def test_no_import_cycle_inside_activations():
    """The registry and the kernel policy read without each other: impl.py consults a decision table that
    policy.py, above the activations it checks, fills."""
    graph = module_graph("activations")
    assert {"impl", "aglu", "policy", "selfcheck", "__init__"} <= set(graph) and cycle(graph) is None
    assert cycle({"aglu": {"impl"}, "impl": {"selfcheck"}, "selfcheck": {"aglu"}}) == ["aglu", "impl", "selfcheck",
                                                                                      "aglu"]


def test_no_import_cycle_inside_stats_analysis_and_sweep():
    """Each room's modules import one way: the sweep's status reads the run directories' names from plan.py, never
    from the command line that imports it (the circle sweep/cli.py <-> sweep_status.py used to be)."""
    graphs = {room: module_graph(room) for room in ("stats", "analysis", "sweep")}
    assert {"cli", "plan", "schedule", "launchers", "status", "cost", "__main__"} <= set(graphs["sweep"])
    assert {room: cycle(graph) for room, graph in graphs.items()} == {"stats": None, "analysis": None, "sweep": None}


def top_level_imports(path):
    """The modules a file imports when it is imported: its module-level import statements (not those inside
    functions, which wait until the function runs)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield from [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]


def test_a_trainer_process_starts_without_scipy_or_matplotlib():
    """Every trainer process (a torchrun worker, each restart, each sweep run) pays for what its imports import:
    scipy.stats ~0.6 CPU-s and matplotlib ~0.3 wait inside the functions that use them (the reports, PPL-p%)."""
    seen, todo, outside = set(), ["train_gpt2", "train_translation"], set()
    while todo:
        name = todo.pop()
        path = next((p for p in (ROOT / f"{name.replace('.', '/')}.py", ROOT / name.replace(".", "/") / "__init__.py")
                     if p.is_file()), None)
        if path is None or name in seen:
            continue
        seen.add(name)
        for imported in top_level_imports(path):
            if imported.split(".")[0] in ROOMS | {"errors"}:
                todo.append(imported)
            else:
                outside.add(imported.split(".")[0])
    assert "model" in seen and "training.loop" in seen, sorted(seen)
    assert not outside & {"scipy", "matplotlib"}, sorted(seen)


def test_a_cpu_model_never_imports_triton():
    """activations/kernels.py (and Triton, ~0.2 CPU-s a process) is imported when a kernel may run: on a CUDA device,
    or asked for by impl="triton"; an evaluation, a sample or an export on the CPU runs without it."""
    script = ("import sys, torch; from model import GPT, GPTConfig; from activations import build; "
              "m = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=2, n_embd=16, act='aglu'), seed=0); "
              "m(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward(); "
              "build('nswish')(torch.randn(4, 8)).sum().backward(); print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or m == 'activations.kernels'))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
