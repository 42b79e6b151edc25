"""Comments and docstrings say why, never a measured figure (README, house style): a figure goes stale the day
its benchmark is rerun, so it lives in BENCHMARKS.md or experiments/ with its command, and a comment names the
section. The check reads every comment and docstring outside tests/ for unit-bearing numbers: times, memory,
throughput, decimal speed ratios and coverages. A limit the code enforces reads as one ("at most 60 s")."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(?<![\w.^/-])~?\d(?:[\d,]*\d)?(?:\.\d+)?"  # a trailing comma ends a number ("2022, sec. 4")
COMMENT = re.compile(r"(?:^\s*|  )#(.*)")
LIMIT = r"(?:at most|within|under|<=|<|below|limit|budget|timeout|target)\s+"
FIGURE = re.compile(
    rf"{NUMBER}(?:\s?(?:ms|µs|us|ns|sec|seconds?|minutes?|min|hours?|CPU-s|KB|kB|MB|GB|TB|KiB|MiB|GiB|tok/s|"
    r"TFLOP/s|GB/s|TB/s|it/s)|\s[sh])(?![\w/])"
    rf"|{NUMBER}\s?x (?:faster|slower|less|more|the|wide)\b|(?<![\w.])\d+\.\d+x(?![\w\d])"
    r"|\b(?:covered|coverage of|measured)\s+~?\d*\.\d+")


def figures(source):
    """(line, the figure) of each measured-looking number in source's comments and docstrings."""
    # a comment: a line of its own, or after code and two spaces (PEP 8's form; tokenize costs 10x more)
    texts = [(i, m.group(1)) for i, line in enumerate(source.splitlines(), 1) if (m := COMMENT.search(line))]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            doc = ast.get_docstring(node, clean=False)
            texts += [(node.body[0].lineno, doc)] if doc else []
    for line, text in sorted(texts):
        text = re.sub(r'"[^"\n]*"', "", text)  # a quoted example of output ("0.354x") is no measurement
        for match in FIGURE.finditer(text):
            if not re.search(LIMIT + r"$", text[:match.start()], re.IGNORECASE):
                yield line, match.group(0)


def test_no_measured_figure_in_a_comment_or_docstring():
    found = [f"{path.relative_to(ROOT)}:{line}: {figure}" for path in sorted(ROOT.rglob("*.py"))
             if "tests" not in path.relative_to(ROOT).parts[:1] for line, figure in figures(path.read_text())]
    assert found == []


def test_the_check_catches_a_figure_and_passes_a_limit():
    source = ('"""A step takes 88.1 ms on an H200."""\n# 1.3x faster, covered 0.971, ~1.5 GiB each\n'
              'def f():\n    """Within 60 s; at most 3 min; 2s / (1 + s); prints "2.5x"."""\n')
    assert [figure for _, figure in figures(source)] == ["88.1 ms", "1.3x faster", "covered 0.971",
                                                        "~1.5 GiB"]
