"""The package's import graph, read from the source with ``ast`` (nothing is imported).

The layers, lowest first (:data:`LAYERS`); a module imports only from its own layer or the
ones below it::

    _warnings, _version, _validate, reference, _C            leaves
    _extension                                              loads _C
    ops                                                     Triton kernels and launchers
    _dispatch, _processors                                  picks the backend; the routing table;
                                                            the processors' edit list
    verification, tree_verification, kv_cache, logprobs     the custom ops
    models, ngram, tuning, adaptive, compat                 models, drafters' parts, adapters
    grammar                                                 constraints (tokenizers of models)
    decoding                                                the loop's parts
    distributed                                             tensor-parallel targets of the loop
    generation, integrations                                the loop and its faces
    benchmarks, cli, demo_pretrained, __main__, the face    entry points; __init__

Four rules are checked, on every import, at module level or inside a function alike:

(a) No submodule imports the package face (``import specdec_kernels``, or ``from specdec_kernels
    import name`` where ``name`` is not a submodule) except the entry points ``cli``,
    ``__main__`` and ``benchmarks``, which sit above everything the face gathers.
(b) No import cycle between modules (an edge is ``a`` importing module ``b``; ``from p import m``
    with ``m`` a submodule of ``p`` is an edge to ``p.m``; a package's ``__init__`` is the node
    ``p``, and a module's implicit import of its parent packages is not an edge).
(c) No ``from X import _private`` and no ``alias._private`` (``alias`` bound to a module) where
    ``X`` lives in another top-level room (subpackage or top-level module) than the importer:
    a name used across rooms is public. Private *modules* (``_validate``) may be imported.
(d) No edge from a room to a room of a higher layer; every room has a layer.
"""

import ast
import os

import pytest

PKG = "specdec_kernels"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PKG)
ENTRY_POINTS = {"cli", "__main__", "benchmarks"}
EXTENSIONS = {f"{PKG}._C"}  # compiled: a leaf of the graph
LAYERS = [
    {"_warnings", "_version", "_validate", "reference", "_C"},
    {"_extension"},
    {"ops"},
    {"_dispatch", "_processors"},
    {"verification", "tree_verification", "kv_cache", "logprobs"},
    # one room each above the parts they use, so that compat -> decoding or models -> grammar
    # is an upward edge
    {"models", "ngram", "tuning", "adaptive", "compat"},
    {"grammar"},
    {"decoding"},
    {"distributed"},
    {"generation", "integrations"},
    # demo_pretrained: the command line's demo of the pretrained pair, on the benchmark's systems
    {"benchmarks", "cli", "demo_pretrained", "__main__", ""},  # "": the package face (__init__)
]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _modules() -> dict[str, str]:
    """Module name -> file path, for every ``.py`` file of the package."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = os.path.join(folder, f)
    return out


MODULES = _modules()


def _is_module(name: str) -> bool:
    return name in MODULES or name in EXTENSIONS


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_package(name: str) -> bool:
    return MODULES.get(name, "").endswith("__init__.py")


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _tree(name: str) -> ast.AST:
    with open(MODULES[name], encoding="utf-8") as fh:
        return ast.parse(fh.read())


def _imports(name: str):
    """``(target module, imported names or None, line)`` for each import in module ``name``."""
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node)
            if target.split(".")[0] == PKG:
                yield target, [a.name for a in node.names], node.lineno


def _room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _edges() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for m in MODULES:
        for target, names, _ in _imports(m):
            if names is None:
                graph[m].add(target)
                continue
            for n in names:
                sub = f"{target}.{n}"
                graph[m].add(sub if _is_module(sub) else target)
        graph[m].discard(m)
    return graph


def face_imports() -> list[str]:
    bad = []
    for m in MODULES:
        if m == PKG or _room(m) in ENTRY_POINTS:
            continue
        for target, names, line in _imports(m):
            if target != PKG:
                continue
            if names is None or any(not _is_module(f"{PKG}.{n}") for n in names):
                bad.append(f"{MODULES[m]}:{line}: imports the package face")
    return bad


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = _edges()
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports() -> list[str]:
    """``from X import _name`` and ``alias._name`` (``alias`` a module of another room)."""
    bad = []
    for m in MODULES:
        aliases = {}  # local name -> module of another room
        for node in ast.walk(_tree(m)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PKG and a.asname and _room(a.name) != _room(m):
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(m, node)
                if target.split(".")[0] != PKG:
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if _is_module(sub):
                        if _room(sub) != _room(m):
                            aliases[a.asname or a.name] = sub
                    elif _private(a.name) and _room(target) != _room(m):
                        bad.append(f"{MODULES[m]}:{node.lineno}: {m} imports {sub}")
        for node in ast.walk(_tree(m)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                sub = f"{aliases[node.value.id]}.{node.attr}"
                if not _is_module(sub):
                    bad.append(f"{MODULES[m]}:{node.lineno}: {m} uses {sub}")
    return sorted(set(bad))


def upward_edges() -> list[str]:
    bad = []
    for m, targets in _edges().items():
        if _room(m) not in LAYER:
            bad.append(f"{MODULES[m]}: room {_room(m)!r} has no layer in LAYERS")
            continue
        for t in targets:
            if LAYER.get(_room(t), -1) > LAYER[_room(m)]:
                up = f"layer {LAYER[_room(m)]} imports layer {LAYER[_room(t)]}"
                bad.append(f"{MODULES[m]}: {m} -> {t} ({up})")
    return sorted(bad)


def test_graph_is_read():
    assert f"{PKG}.verification" in MODULES and f"{PKG}.ops" in MODULES
    assert f"{PKG}.verification" in _edges()[PKG]


def test_no_import_of_the_package_face():
    assert face_imports() == []


def test_no_import_cycle():
    assert cycles() == []


def test_no_private_name_across_rooms():
    assert private_imports() == []


def test_no_import_up_the_layers():
    assert upward_edges() == []


@pytest.mark.parametrize(
    "room, source, rule",
    [
        ("decoding", "import specdec_kernels as sk\n", face_imports),
        ("decoding", "from specdec_kernels.verification import _private\n", private_imports),
        ("decoding", "from specdec_kernels import generation\n", upward_edges),
        ("compat", "from specdec_kernels.decoding import Sampling\n", upward_edges),
        ("models", "from specdec_kernels.grammar import compile_regex\n", upward_edges),
        ("decoding", "from specdec_kernels.distributed import launch\n", upward_edges),
        ("ngram", "from specdec_kernels import decoding\n", upward_edges),
    ],
)
def test_rules_catch_a_planted_violation(tmp_path, monkeypatch, room, source, rule):
    """Each rule fires on a module written to break it (so an empty list means something);
    within the models-and-parts layers too."""
    path = tmp_path / "planted.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, f"{PKG}.{room}.planted", str(path))
    assert [line for line in rule() if str(path) in line]


def test_cycle_rule_catches_a_planted_cycle(tmp_path, monkeypatch):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from specdec_kernels.decoding import planted_b\n")
    b.write_text("def f():\n    from specdec_kernels.decoding.planted_a import x\n")
    monkeypatch.setitem(MODULES, f"{PKG}.decoding.planted_a", str(a))
    monkeypatch.setitem(MODULES, f"{PKG}.decoding.planted_b", str(b))
    assert [f"{PKG}.decoding.planted_a", f"{PKG}.decoding.planted_b"] in cycles()
