"""The docs hold to the code: the examples in docs/plan-format.md, docs/op-rules.md,
docs/planning.md and docs/training.md run as written, every relative link of the README, the
changelog and the pages of issue 50 (docs/architecture.md, docs/design/, docs/training.md,
docs/planning.md) reaches a file (and a heading, for an anchor), and the module map in
python/shardwise/runtime/__init__.py lists every module of that folder with what it imports.

How a page's fenced blocks are read (the info string after the backticks):

- ```python        runs. A page's blocks run in order, each in a fresh namespace, all in one
                   temporary directory, so a block may read a file an earlier one wrote.
- ```python no-run is skipped: it needs torchrun or a model the page does not define.
- ```python torchrun runs under `torchrun --standalone --nproc-per-node 4`: a page's torchrun
                   blocks, in order, as one script (TORCHRUN_PAGES).
- ```json          a complete plan: shardwise.Plan.from_json must read it.
- ```json FILE     also equal, without "predicted", to FILE as the page's blocks wrote it
                   (the page shows a real plan, not a hand-made one).
- ```json fragment part of a plan: it need only be JSON.
- ```cpp table     every line is a row of csrc/ops/op_table_builtin.cc, as written there.

Any other info string on a python or json block fails the test, so a typo cannot turn a
runnable example into a skipped one.
"""
from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

import shardwise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAGES = ["docs/plan-format.md", "docs/op-rules.md", "docs/planning.md"]
TORCHRUN_PAGES = ["docs/training.md"]
# Pages whose relative links must reach a file (and an anchor, a heading of that file).
LINKED = ["README.md", "CHANGELOG.md", "docs/architecture.md", "docs/training.md", "docs/planning.md",
          *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "design", "*.md")))]
RUNTIME = os.path.join(ROOT, "python", "shardwise", "runtime")
_FENCE = re.compile(r"^(\s*)```(.*)$")


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    tag: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = len(m.group(1)), m.group(2).strip()
        lang, _, tag = info.partition(" ")
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != "```":
            # A block inside a list item is indented as its fence is; drop that much.
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        assert j < len(lines), f"{page}:{i + 1}: unclosed code block"
        out.append(Block(page, i + 1, lang, tag.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return out


def _of(page: str, lang: str) -> list[Block]:
    blocks = [b for b in _blocks(page) if b.lang == lang]
    for b in blocks:
        known = {"python": lambda t: t in ("", "no-run", "torchrun"),
                 "json": lambda t: t in ("", "fragment") or t.endswith(".json"),
                 "cpp": lambda t: t in ("", "table")}.get(lang, lambda t: True)
        assert known(b.tag), f"{b.where}: unknown block tag {b.tag!r} on a {lang} block"
    return blocks


def _run_page(page: str, directory) -> None:
    blocks = [b for b in _of(page, "python") if b.tag not in ("no-run", "torchrun")]
    assert blocks, f"{page} has no runnable Python block"
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        for b in blocks:
            # Padded so that a traceback names the page and the line in it.
            exec(compile("\n" * b.line + b.text, b.page, "exec"), {"__name__": "__doc_example__"})
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """ran(page): the directory the page's Python blocks ran in (each page runs once)."""
    done: dict[str, str] = {}

    def run(page: str) -> str:
        if page not in done:
            directory = tmp_path_factory.mktemp(os.path.basename(page).replace(".md", ""))
            _run_page(page, directory)
            done[page] = str(directory)
        return done[page]

    return run


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page, ran):
    ran(page)


def test_the_planning_page_writes_what_it_says(ran):
    directory = ran("docs/planning.md")
    for name in ("gpt2-xl.json", "timeline.svg", "trace.json"):
        assert os.path.exists(os.path.join(directory, name)), f"docs/planning.md's blocks wrote no {name}"


@pytest.mark.slow
@pytest.mark.parametrize("page", TORCHRUN_PAGES)
def test_torchrun_blocks_run_under_torchrun(page, tmp_path):
    blocks = [b for b in _of(page, "python") if b.tag == "torchrun"]
    assert blocks, f"{page} has no torchrun block"
    # Each block padded to its own line numbers would overlap; the script is the blocks in order.
    (tmp_path / "script.py").write_text("".join(b.text for b in blocks))
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "python"),
                                                                      os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", "script.py"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, f"{page}'s torchrun blocks failed:\n{out.stdout}{out.stderr}"
    print(out.stdout[-2000:], file=sys.stderr)


# ---- links --------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    with open(path) as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)  # no headings inside code
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M)}


def _links(page: str) -> list[tuple[int, str]]:
    """(line, target) of every markdown link and image outside code."""
    out, fence = [], False
    with open(os.path.join(ROOT, page)) as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            line = re.sub(r"`[^`]*`", "", line)
            out += [(number, target) for target in re.findall(r"\]\(([^)\s]+)\)", line)]
    return out


@pytest.mark.parametrize("page", LINKED)
def test_relative_links_reach_a_file(page):
    assert os.path.exists(os.path.join(ROOT, page)), f"{page} does not exist"
    broken = []
    for number, target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
            os.path.join(ROOT, page)
        if not os.path.isfile(resolved):
            broken.append(f"{page}:{number}: {target} (no file {os.path.relpath(resolved, ROOT)})")
        elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
            broken.append(f"{page}:{number}: {target} (no heading #{anchor} in {os.path.relpath(resolved, ROOT)})")
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


# ---- the runtime's module map -------------------------------------------------------------------

def _runtime_imports() -> dict[str, set[str]]:
    """Each module of python/shardwise/runtime -> the modules of that folder it imports."""
    out = {}
    for path in sorted(glob.glob(os.path.join(RUNTIME, "*.py"))):
        name = os.path.basename(path)[:-3]
        if name == "__init__":
            continue
        deps = set()
        with open(path) as f:
            for node in ast.walk(ast.parse(f.read(), path)):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardwise.runtime."):
                    deps.add(node.module.split(".")[2])
        out[name] = deps
    return out


def _runtime_map() -> list[tuple[str, list[str], bool]]:
    """(module, the modules its entry says it imports, whether the entry ends with '...')."""
    with open(os.path.join(RUNTIME, "__init__.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    entries: list[list[str]] = []
    for line in doc.splitlines():
        if re.match(r"^    \w", line):
            entries.append([line])
        elif entries and re.match(r"^     +\S", line):
            entries[-1].append(line)
    out = []
    for entry in entries:
        text = " ".join(" ".join(entry).split())
        name = text.split()[0]
        deps = re.search(r"\(([^()]*)\)$", text)
        assert deps, f"runtime/__init__.py: the entry of {name} does not end with its imports in parentheses"
        listed = [d.strip() for d in deps.group(1).split(",") if d.strip()]
        out.append((name, [d for d in listed if d != "..."], "..." in listed))
    return out


def test_the_runtime_module_map_lists_every_module_and_its_imports():
    actual = _runtime_imports()
    entries = _runtime_map()
    listed = [name for name, _, _ in entries]
    assert sorted(listed) == sorted(actual), (
        f"python/shardwise/runtime/__init__.py's map: missing {sorted(set(actual) - set(listed))}, "
        f"not in the folder {sorted(set(listed) - set(actual))}")
    seen: set[str] = set()
    for name, deps, partial in entries:
        assert set(deps) <= actual[name], f"the map says {name} imports {sorted(set(deps) - actual[name])}: it does not"
        if not partial:
            assert set(deps) == actual[name], (f"the map's entry of {name} misses its imports "
                                               f"{sorted(actual[name] - set(deps))} (or end it with '...')")
        assert not set(deps) - seen, f"the map lists {name} before {sorted(set(deps) - seen)}, which it imports"
        seen.add(name)


def _canonical(text: str) -> dict:
    doc = json.loads(shardwise.Plan.from_json(text).to_json())
    doc.pop("predicted", None)
    return doc


def test_json_plans_parse():
    blocks = _of("docs/plan-format.md", "json")
    complete = [b for b in blocks if b.tag != "fragment"]
    assert complete, "docs/plan-format.md shows no complete plan"
    for b in blocks:
        try:
            json.loads(b.text)
            if b.tag != "fragment":
                shardwise.Plan.from_json(b.text)
        except (ValueError, shardwise.ShardwiseError) as e:
            pytest.fail(f"{b.where}: {type(e).__name__}: {e}")


def test_json_examples_are_what_the_page_writes(ran):
    page = "docs/plan-format.md"
    named = [b for b in _of(page, "json") if b.tag.endswith(".json")]
    assert named, f"{page} shows no plan its Python blocks write"
    for b in named:
        path = os.path.join(ran(page), b.tag)
        assert os.path.exists(path), f"{b.where}: the page's blocks wrote no {b.tag}"
        with open(path) as f:
            written = _canonical(f.read())
        assert _canonical(b.text) == written, (
            f"{b.where}: the example is not the {b.tag} the page's blocks write now (the search or "
            f"the format changed?); paste the new one:\n{json.dumps(written, indent=2, sort_keys=True)}")


def test_quoted_table_rows_are_in_the_table():
    with open(os.path.join(ROOT, "csrc/ops/op_table_builtin.cc")) as f:
        table = {" ".join(line.split()) for line in f}
    rows = [(b, line) for b in _of("docs/op-rules.md", "cpp") if b.tag == "table"
            for line in b.text.splitlines() if line.strip()]
    assert rows, "docs/op-rules.md quotes no table row"
    for b, line in rows:
        if " ".join(line.split()) not in table:
            pytest.fail(f"{b.where}: not a row of op_table_builtin.cc: {line.strip()}")


def test_no_rule_registration_from_python():
    """docs/op-rules.md says rules cannot be registered from Python; the bindings agree."""
    exposed = [n for n in dir(shardwise._C) if "rule" in n.lower() or "op_table" in n.lower()]
    assert exposed == [], f"shardwise._C now exposes {exposed}: update docs/op-rules.md"
