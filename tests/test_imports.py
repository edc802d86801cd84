"""Imports inside the project flow one way: the graph of mtcommon, moses_rnn and cslm modules has no cycle,
and between the packages it runs moses_rnn -> mtcommon <- cslm only.

Every `import` and `from ... import` counts, at module level or inside a
function (a function-level import only hides a cycle until the call).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mtcommon", "moses_rnn", "cslm")
# The packages each package may import: the shared ground neither of the others, and they not each other.
ALLOWED = {"mtcommon": {"mtcommon"}, "moses_rnn": {"moses_rnn", "mtcommon"}, "cslm": {"cslm", "mtcommon"}}


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def known(name: str, modules: dict) -> str | None:
    """The longest prefix of dotted `name` that is a project module (None: not the project's)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in modules:
            return prefix
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its body."""
    modules = project_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for t in targets:
                dep = known(t, modules)
                if dep is not None and dep != mod:
                    graph[mod].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_is_read_correctly():
    """The checker sees module-level, relative, `from . import x` and function-level imports."""
    g = import_graph()
    assert "moses_rnn.networks.modelbase" in g["moses_rnn.networks.model"]  # from .modelbase import ...
    assert {"moses_rnn.networks.model", "moses_rnn.networks.rnnsearch"} <= g["moses_rnn.networks.modelio"]
    assert "moses_rnn.networks.modelio" in g["moses_rnn.commands.analyze"]  # imported inside the commands' functions
    assert "moses_rnn.networks.modelio" in g["moses_rnn.training.train"]  # from ..networks import modelio
    assert "mtcommon.modeldir" in g["cslm.modeldir"]  # from mtcommon import modeldir
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_packages_import_one_way():
    """moses_rnn -> mtcommon <- cslm: cslm imports nothing of moses_rnn, mtcommon neither package."""
    crossing = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                      if d.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not crossing, "imports against the one-way flow: " + ", ".join(crossing)


def test_architectures_build_only_on_the_base_module():
    """The encoder-decoder and RNNsearch import the shared base, never each other or the tools;
    the base imports only the project's error type and its package's list of architectures
    (moses_rnn.networks.ARCHS), which import nothing."""
    g = import_graph()
    assert g["moses_rnn.networks.model"] == {"moses_rnn.networks.modelbase"}
    assert g["moses_rnn.networks.rnnsearch"] == {"moses_rnn.networks.modelbase"}
    assert g["moses_rnn.networks.modelbase"] <= {"mtcommon.errors", "moses_rnn.networks"}
    assert g["mtcommon.errors"] == set() and g["moses_rnn.networks"] == set()


def test_the_servers_rooms_build_on_each_other_one_way():
    """cslm.server wires the rooms; the limits, the statistics, the n-gram cache and the batcher import neither
    it, nor the engine (and so not torch), nor each other beyond the statistics the batcher counts into and
    the cache it keeps."""
    g = import_graph()
    assert g["cslm.limits"] <= {"cslm.protocol", "mtcommon.errors"}
    assert g["cslm.stats"] <= {"cslm.protocol"}
    assert g["cslm.ngram_cache"] == set()
    assert g["cslm.batcher"] <= {"cslm.stats", "cslm.ngram_cache"}
    assert {"cslm.limits", "cslm.stats", "cslm.batcher"} <= g["cslm.server"]


def test_the_command_line_gathers_the_commands_which_only_the_command_line_imports():
    """moses_rnn.cli builds the group from moses_rnn.commands; a command imports the library, never another
    command; nothing of the library imports a command or the group."""
    g = import_graph()
    commands = {m for m in g if m.startswith("moses_rnn.commands.")}
    assert commands == {f"moses_rnn.commands.{n}" for n in ("train", "score", "ini", "generate", "analyze")}
    # and the package's __version__, the group's class (one-line usage errors) that cslm's group shares, and the
    # allocator's setting that the group makes before any command runs
    assert g["moses_rnn.cli"] == commands | {"moses_rnn", "mtcommon.cliutil", "mtcommon.allocator"}
    front = commands | {"moses_rnn.cli", "moses_rnn.commands"}
    assert not [f"{m} -> {d}" for m in g for d in g[m] if d in front and m != "moses_rnn.cli"]
