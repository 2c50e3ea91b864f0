"""The examples in docs/plan-format.md and docs/op-rules.md run as written.

How a page's fenced blocks are read (the info string after the backticks):

- ```python        runs. A page's blocks run in order, each in a fresh namespace, all in one
                   temporary directory, so a block may read a file an earlier one wrote.
- ```python no-run is skipped: it needs torchrun or a model the page does not define.
- ```json          a complete plan: shardwise.Plan.from_json must read it.
- ```json FILE     also equal, without "predicted", to FILE as the page's blocks wrote it
                   (the page shows a real plan, not a hand-made one).
- ```json fragment part of a plan: it need only be JSON.
- ```cpp table     every line is a row of csrc/ops/op_table_builtin.cc, as written there.

Any other info string on a python or json block fails the test, so a typo cannot turn a
runnable example into a skipped one.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import pytest

import shardwise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["docs/plan-format.md", "docs/op-rules.md"]
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
        known = {"python": lambda t: t in ("", "no-run"),
                 "json": lambda t: t in ("", "fragment") or t.endswith(".json"),
                 "cpp": lambda t: t in ("", "table")}.get(lang, lambda t: True)
        assert known(b.tag), f"{b.where}: unknown block tag {b.tag!r} on a {lang} block"
    return blocks


def _run_page(page: str, directory) -> None:
    blocks = [b for b in _of(page, "python") if b.tag != "no-run"]
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
