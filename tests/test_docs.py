"""Docs that cannot rot: every repository path, module, script and command-line flag that the docs, the
docstrings and the configs' comments name exists, and no text (docs, code, tests, configs) points at an external
issue tracker.

Docs: every .md file git tracks (README.md, docs/*.md, BENCHMARKS.md, activations/README.md, experiments/*.md;
not a run's own report such as runs/gpu_check/gpu_check.md); their relative links lead to a file and, with a
#fragment, to one of its headings. Docstrings: of the modules, classes and functions of the project's .py files
(tests excluded). Comments: of configs/*.toml. Commands are read from code blocks, indented docstring and comment
lines and `backticked` spans; each --flag is checked against the script it follows."""
import argparse
import ast
import functools
import importlib.util
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sweep import plan as sweep_plan
from training import config

ROOT = Path(__file__).resolve().parents[1]


def tracked(root, pattern):
    """The files under root that git tracks and that match a pathspec such as "*.md" (any folder) or
    "configs/*.toml": what a clone holds, not what a run wrote into the tree. Outside a git checkout (an unpacked
    archive, no git) every match outside hidden folders."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", pattern], cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        listed = None
    if listed is not None and listed.returncode == 0:
        return sorted(root / name for name in listed.stdout.split("\0") if name)
    glob = pattern if "/" in pattern else f"**/{pattern}"  # git's "*.md" matches in every folder
    return sorted(p for p in root.glob(glob) if not any(part.startswith(".") for part in p.relative_to(root).parts))


PACKAGES = ("activations", "analysis", "bench", "data", "eval", "export", "model_parts", "stats", "sweep", "training", "translation")
DOCS = tracked(ROOT, "*.md")
SOURCES = [*sorted(ROOT.glob("*.py")), *(p for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py")))]
CONFIGS = tracked(ROOT, "configs/*.toml")
EVERY_TEXT = [*DOCS, *SOURCES, *sorted((ROOT / "tests").glob("*.py")), *CONFIGS,
              ROOT / "requirements.txt", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]

# A repository path starts with one of our folders or top-level files, and names a file by its extension or
# a folder by its trailing slash: extension-less words such as data/tiny_shards (written by a run) or
# eval/val_loss (a wandb key) are not taken for paths.
PATH_PREFIXES = tuple(f"{d}/" for d in (*PACKAGES, "configs", "docs", "tests", "experiments", ".ci")) + (
    "errors.py", "model.py", "sample.py", "train_gpt2.py", "train_translation.py", "requirements.txt", "pyproject.toml",
    "BENCHMARKS.md", "README.md")
OTHER_REPOSITORIES = ("data/*/prepare.py",)  # nanoGPT's, in docs/coming_from.md's table
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def where(path):
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def comments(toml_text):
    """The comment lines of a TOML file without their "#"; a command in them ("#   python ...", indented past the
    prose) indented by 4 spaces, as in a docstring, so that commands() reads it as code."""
    lines = [line.lstrip()[1:] for line in toml_text.splitlines() if line.lstrip().startswith("#")]
    return "\n".join("    " + line.strip() if line.startswith("  ") else line for line in lines)


def docs_and_docstrings():
    """(where, text) of every doc, of the comments of every config and of every docstring in SOURCES."""
    for path in DOCS:
        yield where(path), path.read_text()
    for path in CONFIGS:
        yield where(path), comments(path.read_text())
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if doc := ast.get_docstring(node):
                    yield where(path) + (f" ({node.name})" if hasattr(node, "name") else ""), doc


def commands(text):
    """Code lines (in a ``` fence, or indented by 4 spaces in a docstring), continuations joined, and the
    `backticked` spans of the other lines."""
    fenced, out = False, []
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            out.append(line)
        else:
            out += re.findall(r"`([^`]+)`", line)
    return out


def invocations(command):
    """(script path or "-m module", its arguments) of each python or torchrun in a command line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)  # drops comments, splits at && | ;
    lexer.whitespace_split = True
    try:
        tokens = [*lexer, ";"]
    except ValueError:  # an unbalanced quote: prose, not a command
        return
    for i, token in enumerate(tokens):
        if token not in ("python", "python3", "torchrun"):
            continue
        args = tokens[i + 1:next(j for j in range(i, len(tokens)) if tokens[j] in ("&&", "||", ";", "|", "&"))]
        if token == "torchrun":  # its own options come first, then the script
            args = args[next((k for k, a in enumerate(args) if a.endswith(".py")), len(args)):]
        if args[:1] == ["-m"] and len(args) > 1:
            yield "-m " + args[1], args[2:]
        elif args and args[0].endswith(".py"):
            yield args[0], args[1:]


def all_invocations():
    for where, text in docs_and_docstrings():
        for command in commands(text):
            for target, args in invocations(command):
                yield where, command, target, args


def our_file(target):
    """The file of a script or `-m module` of this repository; None for pytest, venv or another repository's."""
    if target.startswith("-m "):
        module = target[3:]
        if module.split(".")[0] not in PACKAGES:
            return None
        package = ROOT / module.replace(".", "/")  # `python -m sweep` runs the package's __main__.py
        return package / "__main__.py" if package.is_dir() else package.with_suffix(".py")
    return None if target.startswith(("../", "/", "$")) else ROOT / target


def value(args, flag):
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def test_repository_paths_exist():
    """A glob matches something; path::name names a test function of that file."""
    missing = []
    for where, text in docs_and_docstrings():
        for token in re.split(r"[\s`'\"();|]+", text):
            path, _, test = token.split("=")[-1].rstrip(".,:").partition("::")
            if (not path.startswith(PATH_PREFIXES) or path.startswith(OTHER_REPOSITORIES)
                    or not (path.endswith("/") or "." in path.rsplit("/", 1)[-1])):
                continue
            if any(c in path for c in "*?["):
                found = any(ROOT.glob(path))
            else:
                found = (ROOT / path).exists() and (not test or re.search(
                    rf"^def {re.escape(test.split('[')[0])}\(", (ROOT / path).read_text(), re.M))
            if not found:
                missing.append(f"{where}: {token}")
    assert not missing, "\n".join(missing)


def test_the_docs_are_the_tracked_files(tmp_path, monkeypatch):
    """The docs are the .md files git tracks: the ones a clone holds are all read, a run's own report written into
    the tree (bench/gpu_check.py's runs/gpu_check/gpu_check.md) is not; outside git, every .md file is."""
    assert {ROOT / "README.md", ROOT / "docs" / "comparing_runs.md", ROOT / "experiments" / "cpu_seed_study.md",
            ROOT / "activations" / "README.md"} <= set(DOCS)
    assert ROOT / "configs" / "gpt2_cpu_tiny.toml" in CONFIGS
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("See `README.md`.\n")
    (tmp_path / "report.md").write_text("See `docs/no_such_page.md`.\n")  # untracked, pointing at nothing
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout around tmp_path either
    assert tracked(tmp_path, "*.md") == [tmp_path / "docs" / "page.md", tmp_path / "report.md"]  # not a checkout
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "docs/page.md"], cwd=tmp_path, check=True)
    assert tracked(tmp_path, "*.md") == [tmp_path / "docs" / "page.md"]
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tracked(tmp_path, "*.md"))
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", [])
    monkeypatch.setattr(sys.modules[__name__], "CONFIGS", [])
    test_repository_paths_exist()
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [tmp_path / "report.md"])
    with pytest.raises(AssertionError, match="docs/no_such_page.md"):
        test_repository_paths_exist()


def anchor(heading):
    """GitHub's fragment for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_markdown_links_lead_somewhere():
    """[text](path#fragment) relative to the doc: the file exists and has a heading with that fragment."""
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists() or fragment and fragment not in {
                    anchor(h) for h in re.findall(r"^#+ (.*)", linked.read_text(), re.M)}:
                broken.append(f"{where(path)}: {target}")
    assert not broken, "\n".join(broken)


def test_named_checkpoints_are_the_ones_the_recipe_writes():
    """`log/aglu/model_19073.pt`: a run directory's checkpoint named in the docs is the last one the README's
    recipe (configs/gpt2_124m.toml) writes: checkpoint_path at its max_steps (a run of N steps ends on
    model_N: tests/test_train_gpt2.py::test_resume_needs_a_checkpoint_and_auto_resume_does_not)."""
    import train_gpt2
    from training.checkpoint import checkpoint_path

    steps = config.load_config(train_gpt2.TrainConfig, ["--config", str(ROOT / "configs" / "gpt2_124m.toml")]).optim.max_steps
    last = checkpoint_path("log/aglu", steps).name
    named = [(where, m) for where, text in docs_and_docstrings()
             for m in re.findall(r"\blog/\w+/(model_\d+\.pt)", text)]
    assert named and "model_19073.pt" in (ROOT / "README.md").read_text()
    assert [f"{w}: {m}" for w, m in named if m != last] == [], f"the recipe's last checkpoint is {last}"


def test_ci_runs_the_readme_test_command():
    """.ci/run installs what the README's test command installs and runs exactly its pytest command."""
    readme = next(line for line in commands((ROOT / "README.md").read_text()) if "-m pytest" in line)
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    install, tests = readme.split(" && python -m pytest")
    assert "python -m pytest" + tests in ci
    assert [part.strip().replace("pip install ", "python -m pip install --quiet ") for part in install.split("&&")] == \
        [line for line in ci if "pip install" in line]


def test_benchmarks_opens_with_one_current_table_of_a_screen():
    """BENCHMARKS.md's opening: one table of at most a screen, each row a figure, its value, machine and date, and
    the command that reproduces it (tests/test_doc_commands.py starts each)."""
    opening = (ROOT / "BENCHMARKS.md").read_text().split("\n## ", 1)[0]
    rows = [line for line in opening.splitlines() if line.startswith("|")][2:]
    assert 5 <= len(rows) and len(opening.splitlines()) <= 30
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 4 and re.fullmatch(r"`python [^`]+`|the same command", cells[3]), row


def test_benchmarks_sections_exist():
    """(BENCHMARKS.md, "Translation: a small-data recipe") names the start of one of its headings."""
    headings = re.findall(r"^#+ (.*)", (ROOT / "BENCHMARKS.md").read_text(), re.M)
    missing = [f"{path.relative_to(ROOT)}: {title}" for path in EVERY_TEXT
               for title in re.findall(r'BENCHMARKS\.md`?,\s+"([^"]+)"', path.read_text())
               if not any(h.startswith(title) for h in headings)]
    assert not missing, "\n".join(missing)


def defines(file, name):
    """A def, class, import or assignment of that name at the top level of the file."""
    return re.search(rf"^(?:def |class |from \S+ import .*)?{re.escape(name)}\b", file.read_text(), re.M)


def resolves(parts):
    """pkg.module[.name]: the longest prefix that is a module of ours, then a name that module defines."""
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for file in (base.with_suffix(".py"), base / "__init__.py"):
            if file.is_file():
                return n == len(parts) or defines(file, parts[n])
    return False


def renamed(parts):
    """x.module.name where module and name are ours but no package x exists (renamed since): our package."""
    if len(parts) < 3 or importlib.util.find_spec(parts[0]):  # torch.distributed.init_process_group is torch's
        return None
    return next((pkg for pkg in PACKAGES if (file := ROOT / pkg / f"{parts[1]}.py").is_file()
                 and defines(file, parts[2])), None)


def test_dotted_module_references_resolve():
    """`analysis.compare`, `eval.hellaswag.evaluate_model`; `harness.distributed.Dist` is training's now."""
    wrong = []
    for where, text in docs_and_docstrings():
        for name in re.findall(r"(?<![\w.$/-])[a-z_]\w*(?:\.\w+)+", text):
            parts = name.split(".")
            # a file name (llm.c's train_gpt2.cu, a sweep directory's sweep.md and sweep.json too): not a module
            if parts[-1] in ("py", "cu", "md", "json"):
                continue
            if parts[0] in (*PACKAGES, *(p.stem for p in ROOT.glob("*.py"))):
                if not resolves(parts):
                    wrong.append(f"{where}: {name}")
            elif package := renamed(parts):
                wrong.append(f"{where}: {name} (no package {parts[0]}: {package}.{'.'.join(parts[1:])}?)")
    assert not wrong, "\n".join(wrong)


def test_scripts_and_modules_exist():
    missing = []
    for where, command, target, _ in all_invocations():
        if file := our_file(target):
            found = file.is_file()
        else:
            found = not target.startswith("-m ") or importlib.util.find_spec(target[3:].split(".")[0])
        if not found:
            missing.append(f"{where}: {command}")
    assert not missing, "\n".join(missing)


class Interface(Exception):
    """Raised, with a flag -> accepted? function, when a script's main() starts reading its command line."""


def trainer_accepts(cls, flag):
    """As training/config.load_config reads argv: only an unknown key is an error here (the value is a dummy)."""
    try:
        config.load_config(cls, [flag, "0"])
    except config.ConfigError as e:
        return not str(e).startswith("unknown config key")
    return True


@functools.cache
@functools.cache  # a script's top level runs once, however many commands start it
def accepts(script):
    """flag -> accepted? for a script of ours: runs its main() until it reads argv (argparse, or
    training/config.run_cli for the trainers) and stops it there, before any data, model or device is touched."""
    def argparse_seen(parser, *args, **kwargs):
        raise Interface(lambda flag: flag in parser._option_string_actions)

    def run_cli_seen(doc, cls, argv, run):
        raise Interface(lambda flag: flag in ("-h", "--help") or trainer_accepts(cls, flag))

    with pytest.MonkeyPatch.context() as patch:
        # a script's top level may set its environment before triton loads (bench/kernel_instructions.py unsets
        # TRITON_INTERPRET): a copy, so that this worker's later children (the kernel probe's fork server) keep it
        patch.setattr(os, "environ", os.environ.copy())
        patch.setattr(argparse.ArgumentParser, "parse_known_args", argparse_seen)
        patch.setattr(config, "run_cli", run_cli_seen)
        patch.setattr(sys, "argv", [str(script)])
        try:
            runpy.run_path(str(script), run_name="__main__")
        except Interface as seen:
            return seen.args[0]
    raise AssertionError(f"{script} never read its command line")


@functools.cache
def nanoact_model_args():
    """The model_args our lm-eval model takes, read from its source (importing it imports lm-eval)."""
    tree = ast.parse((ROOT / "eval" / "lm_eval_model.py").read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {a.arg for a in init.args.args[1:]}


def test_flags_are_accepted():
    """Each --flag after a script of ours is one it accepts (torchrun's own come before the script). Flags
    hidden in shell variables (`FT="--init-from gpt2 ..."`, then `$FT`) are not read."""
    unknown = []
    for where, command, target, args in all_invocations():
        if not (file := our_file(target)) or not file.is_file():
            continue
        if file == ROOT / "eval" / "lm_eval_model.py":
            # lm-eval's own CLI reads every flag; ours are only the model name and its model_args
            if value(args, "--model") == "nanoact":
                keys = {kv.split("=")[0] for kv in (value(args, "--model_args") or "").split(",") if kv}
                unknown += [f"{where}: model_args {k} in {command}" for k in keys - nanoact_model_args()]
            continue
        flags = [a.split("=")[0] for a in args if a.startswith("--")]
        accepted = [accepts(file)] if flags else []
        if flags and file in (ROOT / "sweep" / "__main__.py", ROOT / "analysis" / "sweep.py"):
            plan = value(args, "--plan")  # the options the sweep does not know go to its trainer
            trainer = value(args, "--trainer") or (plan and sweep_plan.read_file(ROOT / plan).trainer) or "gpt2"
            accepted.append(accepts(sweep_plan.TRAINERS[trainer]))
        unknown += [f"{where}: {flag} in {command}" for flag in flags if not any(ok(flag) for ok in accepted)]
    assert not unknown, "\n".join(unknown)


def test_no_issue_tracker_references():
    """Not "issue 11": the reader has no such tracker. Point at the BENCHMARKS.md section, the experiments/
    file or the test that holds the fact."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in EVERY_TEXT if path != Path(__file__)
             for n, line in enumerate(path.read_text().splitlines(), 1) if ISSUE.search(line)]
    assert not found, "\n".join(found)


def test_a_planted_mistake_in_a_doc_is_caught(tmp_path, monkeypatch):
    """The checks above read docs/ as they read the README, and a config's comments too: a doc or a config
    naming a missing file, a flag its script does not take or a link to no heading fails them."""
    planted = tmp_path / "planted.md"
    planted.write_text("See `docs/no_such_page.md` and [training](%s#no-such-heading).\n\n```bash\n"
                       "python train_gpt2.py --config configs/gpt2_cpu_tiny.toml --no-such-flag 3\n```\n"
                       % (ROOT / "docs" / "training.md"))
    planted_config = tmp_path / "planted.toml"
    planted_config.write_text("# The study of configs/no_such_plan.toml, run as\n"
                              "#   python train_gpt2.py --config configs/gpt2_cpu_tiny.toml \\\n"
                              "#       --no-such-config-flag 3\n[model]\nn_layer = 2\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [planted])
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", [])
    monkeypatch.setattr(sys.modules[__name__], "CONFIGS", [planted_config])
    checks = [(test_repository_paths_exist, "docs/no_such_page.md"), (test_flags_are_accepted, "--no-such-flag"),
              (test_markdown_links_lead_somewhere, "no-such-heading"),
              (test_repository_paths_exist, "configs/no_such_plan.toml"),
              (test_flags_are_accepted, "--no-such-config-flag")]
    for check, mistake in checks:
        with pytest.raises(AssertionError, match=re.escape(mistake)):
            check()
