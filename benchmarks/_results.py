"""Each benchmark's latest figures, as data: written by the benchmark, shown in benchmarks/README.md.

A benchmark run with ``--record`` calls ``record(name, rows, meta)`` where it prints its final
table. That writes ``benchmarks/results/<name>.json`` (machine, date, command, columns, rows, and
optionally formats and notes) and regenerates the README's block for it, the text between

    <!-- results:<name> -->
    <!-- /results:<name> -->

Every block is generated from its results file alone, so the README shows what the last
recorded run measured and nothing else; past runs live in benchmarks/runs/. To regenerate every
block by hand (after editing a results file, say):

    python benchmarks/_results.py --render     # rewrite README.md's blocks from results/*.json
    python benchmarks/_results.py --check      # exit 1 if README.md is not what --render writes

The environment variables SHARDWISE_RESULTS_DIR and SHARDWISE_RESULTS_README send a recording
elsewhere (a scratch directory and README copy: the tests do).

``record(..., key=[columns])`` merges instead of replacing: a row of the new run replaces the
stored row with the same key values (its other columns kept), every other stored row stays. A
run of some models or of one world size then updates only those rows, and the caption names the
earlier runs whose figures are still shown.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

# Markers count on lines of their own only (a marker quoted in the text is not one).
BLOCK = re.compile(r"^<!-- results:(?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- /results:(?P=name) -->$", re.S | re.M)
OPENING = re.compile(r"^<!-- results:([\w.-]+) -->$", re.M)
FIELDS = ("name", "machine", "date", "command", "columns", "formats", "notes", "earlier")


def machine() -> str:
    """This machine as the benchmarks name it: CPU model, cores, torch version."""
    from _machine import cpu_model

    try:
        import torch

        version = f", torch {torch.__version__}"
    except ImportError:  # pragma: no cover - every benchmark has torch
        version = ""
    return f"{cpu_model()}, {os.cpu_count()} cores{version}"


def command(argv: Sequence[str] | None = None) -> str:
    """How this run was started, as a README command: `python benchmarks/<script> <args>`, less --record."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).name if argv else "?"
    args = [a for a in argv[1:] if a != "--record"]
    return " ".join(["python", f"benchmarks/{script}", *(shlex.quote(a) for a in args)])


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", action="store_true",
                        help="write the final table to benchmarks/results/<name>.json and regenerate its block in "
                             "benchmarks/README.md")


def _plain(value: Any) -> Any:
    """A JSON value: numbers (numpy's and torch's scalars included), strings, None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if hasattr(value, "item"):
        return _plain(value.item())
    if isinstance(value, (list, tuple)):
        return ", ".join(str(_plain(v)) for v in value)
    return str(value)


def _as_dicts(rows: Iterable[Any], columns: Sequence[str] | None) -> tuple[list[dict], list[str]]:
    out, order = [], list(columns or [])
    for row in rows:
        if isinstance(row, dict):
            d = {str(k): _plain(v) for k, v in row.items()}
        else:
            if not columns:
                raise ValueError("record: rows given as lists need meta['columns']")
            row = list(row)
            if len(row) != len(columns):
                raise ValueError(f"record: a row of {len(row)} cells for {len(columns)} columns: {row}")
            d = {c: _plain(v) for c, v in zip(columns, row)}
        for c in d:
            if c not in order:
                order.append(c)
        out.append(d)
    return out, order


def load(name: str, results_dir: Path | str | None = None) -> dict:
    path = Path(results_dir or RESULTS) / f"{name}.json"
    with open(path) as f:
        return json.load(f)


def _dump(doc: dict) -> str:
    """JSON with one line per row (diffs show which figures moved)."""
    lines = ["{"]
    items = [(k, doc[k]) for k in FIELDS if k in doc and k != "columns"]
    for k, v in items:
        lines.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    lines.append(f' "columns": {json.dumps(doc["columns"], ensure_ascii=False)},')
    rows = [f"  {json.dumps(r, ensure_ascii=False)}" for r in doc["rows"]]
    lines.append(' "rows": [' + ("\n" + ",\n".join(rows) + "\n ]" if rows else "]"))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _default_dir() -> Path:
    return Path(os.environ.get("SHARDWISE_RESULTS_DIR") or RESULTS)


def _default_readme() -> Path:
    return Path(os.environ.get("SHARDWISE_RESULTS_README") or README)


def record(name: str, rows: Iterable[Any], meta: dict | None = None, *, key: Sequence[str] | None = None,
           results_dir: Path | str | None = None, readme: Path | str | None = "default") -> Path:
    """Writes results/<name>.json from `rows` and regenerates README's block <name>.

    rows: dicts (column -> value; columns in the order first seen) or lists (then
    meta["columns"] names them). Values: numbers, strings or None (shown "-").
    meta: "machine" (default: this one's CPU, cores and torch), "date" (default: today),
    "command" (default: this process's, as `python benchmarks/...`), "columns", "formats"
    (column -> format spec for numbers, e.g. ".2f"), "notes" (text under the table).
    key: merge on these columns instead of replacing the file (see the module's docstring).
    readme: the README whose block to regenerate (None: none; default benchmarks/README.md); a
    README without the block is left alone. Returns the results file's path."""
    meta = dict(meta or {})
    new_rows, columns = _as_dicts(rows, meta.get("columns"))
    path = Path(results_dir or _default_dir()) / f"{name}.json"
    readme = _default_readme() if readme == "default" else readme
    doc = {"name": name, "machine": meta.get("machine") or machine(), "date": meta.get("date") or
           time.strftime("%Y-%m-%d"), "command": meta.get("command") or command()}
    formats = dict(meta.get("formats") or {})
    earlier: list[dict] = list(meta.get("earlier") or [])
    if key and path.exists():
        old = json.loads(path.read_text())
        stored = [dict(zip(old["columns"], r)) for r in old["rows"]]
        index = {tuple(r.get(k) for k in key): r for r in stored}
        kept_old = False
        for r in new_rows:
            k = tuple(r.get(c) for c in key)
            if k in index:
                kept_old |= any(c not in r for c in index[k])
                index[k].update(r)
            else:
                stored.append(r)
                index[k] = r
        new_keys = {tuple(r.get(c) for c in key) for r in new_rows}
        kept_old |= any(tuple(r.get(c) for c in key) not in new_keys for r in stored)
        columns = list(old["columns"]) + [c for c in columns if c not in old["columns"]]
        formats = {**old.get("formats", {}), **formats}
        if kept_old:
            for run in [{k: old[k] for k in ("date", "machine", "command")}, *old.get("earlier", [])]:
                if run not in earlier and run != {k: doc[k] for k in ("date", "machine", "command")}:
                    earlier.append(run)
        new_rows = stored
    if formats:
        doc["formats"] = {c: f for c, f in formats.items() if c in columns}
    if meta.get("notes"):
        doc["notes"] = meta["notes"]
    if earlier:
        doc["earlier"] = earlier
    doc["columns"] = columns
    doc["rows"] = [[r.get(c) for c in columns] for r in new_rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(doc))
    if readme is not None and Path(readme).exists():
        text = Path(readme).read_text()
        if name in names_in(text):
            Path(readme).write_text(render(text, path.parent, names=[name]))
            print(f"recorded {path} and its table in {readme}")
        else:
            print(f"recorded {path} ({readme} has no block for it)")
    else:
        print(f"recorded {path}")
    return path


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, (int, float)):
        text = format(value, fmt) if fmt else str(value)  # a float without a format: its shortest repr
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ") or " "


def table(doc: dict) -> str:
    """The results as a Markdown table."""
    formats = doc.get("formats", {})
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in doc["columns"]) + " |",
             "| " + " | ".join("---" for _ in doc["columns"]) + " |"]
    for row in doc["rows"]:
        lines.append("| " + " | ".join(_cell(v, formats.get(c)) for c, v in zip(doc["columns"], row)) + " |")
    return "\n".join(lines)


def caption(doc: dict) -> str:
    text = f"*{doc['date']}, {doc['machine']}: `{doc['command']}`.*"
    if doc.get("earlier"):
        text += " Rows or columns from earlier runs: " + "; ".join(
            f"{r['date']}, {r['machine']}: `{r['command']}`" for r in doc["earlier"]) + "."
    if doc.get("notes"):
        text += " " + doc["notes"]
    return text


def block(doc: dict) -> str:
    """What goes between a block's two markers."""
    return f"{table(doc)}\n\n{caption(doc)}\n"


def names_in(text: str) -> list[str]:
    """The results blocks a README holds, in order."""
    return OPENING.findall(text)


def render(text: str, results_dir: Path | str | None = None, names: Iterable[str] | None = None) -> str:
    """`text` with each results block (those in `names`, default all) regenerated from its file.
    A block whose file is missing, or an opening marker without its closing one, raises."""
    wanted = None if names is None else set(names)
    closed = [m.group("name") for m in BLOCK.finditer(text)]
    unclosed = [n for n in names_in(text) if n not in closed]
    if unclosed:
        raise ValueError(f"results blocks without their closing marker: {unclosed}")

    def one(m: re.Match) -> str:
        name = m.group("name")
        if wanted is not None and name not in wanted:
            return m.group(0)
        return f"<!-- results:{name} -->\n{block(load(name, results_dir))}<!-- /results:{name} -->"

    return BLOCK.sub(one, text)


def check(readme: Path | str = README, results_dir: Path | str | None = None) -> list[str]:
    """What is out of step: blocks without a results file, results files without a block, and
    whether README differs from its rendering. Empty: in step."""
    text = Path(readme).read_text()
    blocks = names_in(text)
    files = sorted(p.stem for p in Path(results_dir or RESULTS).glob("*.json"))
    problems = [f"block {n} has no results/{n}.json" for n in blocks if n not in files]
    problems += [f"results/{n}.json has no block in {Path(readme).name}" for n in files if n not in blocks]
    problems += [f"block {n} appears {blocks.count(n)} times" for n in sorted(set(blocks)) if blocks.count(n) > 1]
    if not problems and render(text, results_dir) != text:
        problems.append(f"{Path(readme).name} differs from its rendering: run python benchmarks/_results.py --render")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--render", action="store_true", help="regenerate README.md's results blocks")
    what.add_argument("--check", action="store_true", help="exit 1 if README.md is out of step with results/")
    parser.add_argument("--readme", default=str(README))
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.render:
        text = Path(args.readme).read_text()
        rendered = render(text, args.results)
        if rendered != text:
            Path(args.readme).write_text(rendered)
        state = "changed" if rendered != text else "unchanged"
        print(f"{args.readme}: {len(names_in(rendered))} blocks rendered ({state})")
        return 0
    problems = check(args.readme, args.results)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
