"""The package's import layers, checked by walking the syntax tree of every file in verispec/.

The rules (this table is the single source: the test parses it):

    importer    may import from verispec ("-": nothing)
    device      -
    jit         -
    analysis    -
    verify      device jit verify
    runtime     device jit analysis runtime
    drafters    device jit analysis verify runtime drafters
    engine      device jit analysis verify runtime drafters engine
    distributed device jit analysis verify runtime drafters distributed
    serve       device jit analysis verify runtime drafters engine serve
    training    device jit analysis verify runtime drafters engine training
    bench       device jit analysis verify runtime drafters engine distributed training bench
    launch      device jit analysis verify runtime drafters engine distributed launch
    verispec    device jit analysis verify runtime drafters engine verispec
    cli         device jit analysis verify runtime drafters engine distributed serve bench launch training verispec cli

A layer is a top-level module or subpackage of verispec (``verispec/verify/triton/greedy.py`` is in
``verify``); ``verispec`` is the package's ``__init__.py`` (its re-exports), so ``from verispec import
generate`` inside the package counts as importing the whole public API. Reading the table: device.py
and jit.py are the bottom and import nothing of verispec; verification depends only on them; the
runtime never imports verification, drafters or the engine; drafters may use the runtime, never the
engine; the engine sits on verify, runtime and drafters; tensor parallelism and SSD (``distributed``)
provide models and a drafter and never import the engine, which drives them; ``launch`` (the SSD launch: the
engine on the target ranks, the draft server on the draft rank) sits on both, and ``distributed/__main__.py``,
the command's entry point ``python -m verispec.distributed``, belongs to it (``ENTRY_POINTS``); the server (``serve``) is a skin over the
engine; ``training`` (``verispec train-head``) drives the engine to distill data for a drafter's head; bench (the ``verispec bench`` studies) measures the engine, uses the simulator and takes its held-out prompts from ``training``; only cli.py sits
on top. Nothing in verispec/ imports the repository's ``dev`` or ``benchmarks`` packages at all.

Every import counts: ``import a.b``, ``from a import b``, relative imports (resolved against the
importing file's package), imports inside functions or ``if TYPE_CHECKING:`` blocks, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "verispec"
OUTSIDE_THE_PACKAGE = ("dev", "benchmarks")   # importable from the repository root, never from verispec/
# modules that are a layer's command entry point though they sit in another layer's folder
ENTRY_POINTS = {("verispec", "distributed", "__main__"): "launch"}


def _rules() -> dict[str, set[str]]:
    """{importer layer: layers it may import}, parsed from this module's docstring table."""
    table = __doc__.split("importer    may import from verispec")[1].split("\n\n")[0]
    rules = {}
    for line in table.strip().splitlines()[1:]:
        layer, *allowed = line.split()
        rules[layer] = set() if allowed == ["-"] else set(allowed)
    return rules


RULES = _rules()


def _module_name(path: Path, package_dir: Path) -> list[str]:
    """verispec/verify/api.py -> ["verispec", "verify", "api"]; an __init__.py names its package."""
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _layer(module: list[str], package_dir: Path) -> str:
    """The layer of a module inside the package: its top-level module or subpackage, else the package root."""
    if tuple(module) in ENTRY_POINTS:
        return ENTRY_POINTS[tuple(module)]
    if len(module) < 2:
        return module[0]
    name = module[1]
    if (package_dir / f"{name}.py").is_file() or (package_dir / name / "__init__.py").is_file():
        return name
    return module[0]   # ``from verispec import generate``: a name re-exported by __init__.py


def _imported_modules(tree: ast.AST, importer: list[str], is_package: bool):
    """(line, dotted module) for every import in ``tree``; ``from m import n`` yields m.n (n may be a submodule)."""
    package = importer if is_package else importer[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level > len(package):
                    yield node.lineno, "<relative import beyond the top-level package>"
                    continue
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def import_violations(package_dir: Path, rules: dict[str, set[str]] = RULES) -> list[str]:
    """Every import in ``package_dir`` that breaks ``rules``, as "path:line: message" (sorted)."""
    package = package_dir.name
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        where = path.relative_to(package_dir.parent)
        importer = _module_name(path, package_dir)
        layer = _layer(importer, package_dir)
        if layer not in rules:
            problems.append(f"{where}:1: layer {layer!r} is not in the rules table (tests/test_architecture.py)")
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree, importer, path.name == "__init__.py"):
            top = module.split(".")[0]
            if top in OUTSIDE_THE_PACKAGE:
                problems.append(f"{where}:{line}: imports {module} (dev/ and benchmarks/ are never imported by {package}/)")
            elif top == package:
                target = _layer(module.split("."), package_dir)
                if target not in rules[layer]:
                    problems.append(f"{where}:{line}: {layer} may not import {module} (layer {target})")
            elif top.startswith("<"):
                problems.append(f"{where}:{line}: {module}")
    return problems


def test_every_layer_in_the_table_exists():
    layers = {_layer(_module_name(p, PACKAGE_DIR), PACKAGE_DIR) for p in PACKAGE_DIR.rglob("*.py")}
    assert layers == set(RULES), "the rules table and the package's layers differ"
    assert all(allowed <= set(RULES) for allowed in RULES.values()), "a rule names an unknown layer"


def test_verispec_follows_the_import_rules():
    problems = import_violations(PACKAGE_DIR)
    assert not problems, "import rule violations:\n" + "\n".join(problems)


def test_the_checker_reports_every_kind_of_violation(tmp_path):
    """A small package that breaks each rule once: every break is reported with its file and line."""
    pkg = tmp_path / "verispec"
    files = {
        "__init__.py": "from .engine import generate\n",
        "device.py": "import torch\n",
        "jit.py": "def build():\n    from . import device\n",                                 # jit imports device
        "analysis.py": "",
        "cli.py": "from . import generate\nfrom .engine import run\n",
        "verify/__init__.py": "from .api import verify\n",
        "verify/api.py": "from ..device import to_device\nfrom ..runtime import ops\n",          # verify -> runtime
        "runtime/__init__.py": "",
        "runtime/model.py": ("import importlib\n"
                             "def f():\n    import verispec.engine.decoder\n"                  # runtime -> engine
                             "    return importlib.import_module('dev.kv')\n"),                  # dev/
        "drafters/__init__.py": "from .. import generate\n",                                      # the package root
        "engine/__init__.py": "from ..verify import api\nfrom ..cli import main\n",              # engine -> cli
        "engine/decoder.py": "if False:\n    from benchmarks import decode\n",                    # benchmarks/
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    problems = import_violations(pkg)
    assert problems == [
        "verispec/drafters/__init__.py:1: drafters may not import verispec.generate (layer verispec)",
        "verispec/engine/__init__.py:2: engine may not import verispec.cli.main (layer cli)",
        "verispec/engine/decoder.py:2: imports benchmarks.decode (dev/ and benchmarks/ are never imported by verispec/)",
        "verispec/jit.py:2: jit may not import verispec.device (layer device)",
        "verispec/runtime/model.py:3: runtime may not import verispec.engine.decoder (layer engine)",
        "verispec/runtime/model.py:4: imports dev.kv (dev/ and benchmarks/ are never imported by verispec/)",
        "verispec/verify/api.py:2: verify may not import verispec.runtime.ops (layer runtime)",
    ]
    (pkg / "server.py").write_text("")
    assert "verispec/server.py:1: layer 'server' is not in the rules table" in "\n".join(import_violations(pkg))

