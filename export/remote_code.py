"""The transformers remote code of an exported model, copied from the real sources at export time.

transformers loads remote code as one flat package: it copies the modeling file and the files it
imports as `from .name import ...`, and refuses to load a file that imports a package which is not
installed. So each project module the model needs (export/transformers_wrapper.py, model.py, the
activations registry and activation files, and their own project imports) is written as a flat sibling
file, `activations.aglu` -> `activations_aglu.py`, with its project imports rewritten to relative
ones, located by the AST; everything else in the file stays byte for byte.

The modeling file itself, modeling_nanoact.py, is generated: it imports the wrapper's classes and
registers the model's activation classes by name, so one registered at run time (`activations.register`)
exports too. It also repeats every relative import of the copies, because transformers before 5.x
copies only the files that the modeling file imports itself, not their own imports.
"""
import ast
import importlib.util
from pathlib import Path

import activations
from errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = "export.transformers_wrapper"
MODELING = "modeling_nanoact"
AUTO_MAP = {"AutoConfig": f"{MODELING}.NanoactConfig", "AutoModelForCausalLM": f"{MODELING}.NanoactForCausalLM"}


def flat_name(module):
    return module.replace(".", "_")


def project_file(module):
    """The source file of `module` if it belongs to this repository (not an installed package), else None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location:
        return None
    path = Path(spec.origin).resolve()
    inside = ROOT in path.parents and not {"site-packages", "dist-packages"} & set(path.parts)
    return path if inside else None


def relative_source(module):
    """(source of `module` with its project imports made relative to the flat package, the project modules
    it imports, those rewritten import statements)."""
    path = project_file(module)
    source = path.read_bytes()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edits, needed = [], set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if project_file(alias.name):
                    raise ConfigError(f"{path}:{node.lineno}: `import {alias.name}` cannot be exported as remote code; "
                                      f"write `from {alias.name} import NAME`")
        elif isinstance(node, ast.ImportFrom):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            if not project_file(target):
                continue
            for alias in node.names:
                if project_file(f"{target}.{alias.name}"):
                    raise ConfigError(f"{path}:{node.lineno}: importing the module {target}.{alias.name} cannot be "
                                      f"exported as remote code; write `from {target}.{alias.name} import NAME`")
            needed.add(target)
            edits.append((node, ast.unparse(ast.ImportFrom(module=flat_name(target), names=node.names, level=1))))
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    # ast offsets are UTF-8 byte offsets, hence bytes; replace from the end so that earlier offsets hold.
    for node, text in sorted(edits, key=lambda edit: edit[0].lineno, reverse=True):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        source = source[:begin] + text.encode() + source[end:]
    return source, needed, [text for _, text in edits]


def modeling_source(copied_imports, classes):
    """modeling_nanoact.py: every relative import of the copies, the wrapper's classes, the registrations."""
    lines = ['"""Written by nanoact\'s export/to_transformers.py: the model is export_transformers_wrapper.py\'s\n'
             "NanoactForCausalLM; it and the files it needs are nanoact's own sources, their imports made relative.\n"
             '"""\n',
             "# transformers before 5.x copies only the files this file imports itself: every copied file's\n",
             "# relative imports, repeated.\n"]
    lines += [f"{text}\n" for text in sorted(set(copied_imports))]
    lines += [f"from .{flat_name(WRAPPER)} import NanoactConfig, NanoactForCausalLM\n",
              "\n# This model's activations by registry name (one registered at run time is not in the registry's source).\n",
              f"from .{flat_name('activations')} import register\n"]
    for i, (name, cls) in enumerate(sorted(classes.items())):
        if cls.__module__ == "__main__" or cls.__qualname__ != cls.__name__:
            raise ConfigError(f"activation {name!r} ({cls.__qualname__} in {cls.__module__}) must be a module-level "
                              "class in an importable file to be exported")
        module = f".{flat_name(cls.__module__)}" if project_file(cls.__module__) else cls.__module__
        lines += [f"from {module} import {cls.__name__} as _activation_{i}\n", f"register({name!r}, _activation_{i})\n"]
    return "".join(lines)


def write_remote_code(config, out_dir):
    """Write the remote code of a GPT with GPTConfig `config` into out_dir; its config needs auto_map=AUTO_MAP."""
    name = activations.mlp_activation(config.act)[0]  # a gated MLP's setting (swiglu) names its gate's (silu)
    names = {name, activations.plain_name(name)}  # the top plain_top_k layers use the plain one
    classes = {name: activations.activation_class(name) for name in names}
    todo = [WRAPPER, "model"] + [cls.__module__ for cls in classes.values() if project_file(cls.__module__)]
    done, copied_imports = set(), []
    while todo:
        module = todo.pop()
        if module in done:
            continue
        done.add(module)
        source, needed, imports = relative_source(module)
        (Path(out_dir) / f"{flat_name(module)}.py").write_bytes(source)
        todo.extend(needed)
        copied_imports += imports
    (Path(out_dir) / f"{MODELING}.py").write_text(modeling_source(copied_imports, classes))
