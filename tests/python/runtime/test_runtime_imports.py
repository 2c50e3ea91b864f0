"""The runtime package imports downward only (issue 23, item 5).

Every module of the shardwise package is parsed (not imported) and every import of a shardwise
module is collected, those inside functions included (a lazy import is still an edge: it only
moves the circle to the first call). Three rules for python/shardwise/runtime:

(a) no runtime module is on an import circle: no strongly connected component of the import
    graph with more than one module contains one;
(b) a runtime module imports, outside runtime, only the lower-level modules of ALLOWED;
(c) no runtime module imports `re`: nothing the core decided crosses as text to be parsed.
"""
from __future__ import annotations

import ast
import pathlib

import shardwise

PACKAGE = pathlib.Path(shardwise.__file__).parent
RUNTIME = "shardwise.runtime"

# What the runtime may import from the package above it, and why each is below the runtime:
# none of them imports back into the runtime, capture, plan or the engines.
ALLOWED = {
    "shardwise._C": "the compiled core (rank programs, local shards, schedules)",
    "shardwise._logging": "the package's loggers",
    "shardwise._teardown": "process-group teardown at exit",
    "shardwise._fx_import": "the IR builder's schema helpers and CaptureError, which lowering reads",
    "shardwise._aten_call": "an IR node's ATen call bound from its attributes (lowering and profiling share it)",
    "shardwise._inputs": "binding a model's call by name (what the batch binding and capture share)",
    "shardwise.materialize": "a rank's local shard of a placed tensor",
    "shardwise._tensor_names": "which names of a module's tensors are one (tied weights; capture reads it too)",
    "shardwise._moe_experts": "a mixture of experts' experts as one op (capture takes it; verification runs it)",
    "shardwise._grouped_experts": "torch._grouped_mm in any dtype (capture traces it; verification runs it)",
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _extensions() -> set[str]:
    """Compiled modules (shardwise._C): nodes without outgoing edges."""
    return {"shardwise." + p.name.split(".")[0] for p in PACKAGE.glob("*.so")} | \
        {"shardwise." + p.name.split(".")[0] for p in PACKAGE.glob("*.pyd")} | {"shardwise._C"}


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The shardwise modules `name` imports anywhere in its source, relative ones resolved."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import f` imports mod.
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "shardwise" or target.startswith("shardwise."):
                while target not in known and "." in target:  # a name inside a module: the module
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) | _extensions()
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    for ext in _extensions():
        graph.setdefault(ext, set())
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                out.append(sorted(component))
    return out


def _cycle(graph: dict[str, set[str]], component: list[str], start: str) -> list[str]:
    """One circle through `start` inside `component` (breadth-first: a shortest one)."""
    inside = set(component)
    previous = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & inside):
            if nxt == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return component


def _in_runtime(name: str) -> bool:
    return name == RUNTIME or name.startswith(RUNTIME + ".")


def test_the_parser_sees_lazy_and_relative_imports():
    graph = _graph()
    assert "shardwise._C" in graph["shardwise.runtime.lower"]          # from .. import _C
    assert "shardwise.runtime.mesh" in graph["shardwise.runtime.lower"]  # from .mesh import _Mesh
    assert "shardwise.simulate" in graph["shardwise.plan"]              # inside Plan.predicted_*


def test_no_runtime_module_is_on_an_import_circle():
    graph = _graph()
    circles = [" -> ".join(_cycle(graph, c, next(m for m in c if _in_runtime(m))))
               for c in _components(graph) if len(c) > 1 and any(_in_runtime(m) for m in c)]
    assert not circles, "import circles through the runtime: " + "; ".join(circles)


def test_the_runtime_imports_only_lower_level_modules():
    graph = _graph()
    above = sorted(f"{m} imports {t}" for m in graph if _in_runtime(m)
                   for t in graph[m] if not _in_runtime(t) and t not in ALLOWED)
    assert not above, "runtime modules import modules above the runtime: " + "; ".join(above)


def test_the_allowed_modules_are_below_the_runtime():
    graph = _graph()
    for name in ALLOWED:
        seen, todo = set(), [name]
        while todo:
            node = todo.pop()
            for nxt in graph.get(node, ()):
                assert not _in_runtime(nxt), f"{name} reaches the runtime through {node} -> {nxt}"
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)


def test_no_module_of_the_package_is_on_an_import_circle():
    """Above the runtime too (engine, pipeline and checkpoint once imported each other)."""
    graph = _graph()
    circles = [" -> ".join(_cycle(graph, c, c[0])) for c in _components(graph) if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(circles)


def test_the_runtime_parses_no_text():
    """Issue 23, item 4: what the core decided reaches the runtime typed (resharding steps,
    local shape arguments, schedule actions as tuples), so no runtime module imports `re`."""
    readers = []
    for name, path in _modules().items():
        if not _in_runtime(name):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
            readers += [name for m in imported if m == "re" or (m or "").startswith("re.")]
    assert not readers, f"runtime modules that import re: {sorted(set(readers))}"
