"""The README, held to what it shows (issue 50).

- Its training script runs as written under torchrun with 4 CPU processes (Gloo), followed by
  the checkpoint lines of docs/training.md: the script a reader copies into train.py.
- It stays short: at most 150 lines, and the install, run and test commands on its first screen.
- Its layout table names exactly the folders of the tree: every top-level folder and every
  layer of csrc/, and nothing that is not there; tests/python's folders are the areas its
  README's table names (issue 47, item 5).
- Every shell command in a ```bash / ```sh block runs somewhere: in CI (.ci/run, scripts/test.sh
  or a script they run), or where RUN_BY says (a test, or a script CI runs); or it is marked
  `<!-- gpu-only -->`.
- A block marked `<!-- file: PATH -->` is PATH as the file holds it.

Markers: an HTML comment on the line right before a fence applies to that block.
`<!-- gpu-only -->` blocks need a GPU and are never run here; `<!-- file: PATH -->` blocks are
compared with the file, not run. (The capture and planning examples that were here are in
docs/planning.md, the full training loop in docs/training.md: tests/python/docs/test_docs.py runs them;
the CLI lines: tests/python/cli/test_cli.py; the examples: tests/python/docs/test_examples.py.)
"""
from __future__ import annotations

import fnmatch
import importlib
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_LINES = 150
FIRST_SCREEN = 40

# Shell commands of the README that CI does not run as written, each with what runs it: a test
# ("file::function" under tests/python), which must exist, or a script ("scripts/NAME.sh"), which
# CI must run. Say in a comment how it differs from the README's spelling.
RUN_BY = {
    # The install, in a fresh venv from a clean copy of the checkout (the venv's own python -m pip,
    # pip's -q; rich beside the build tools), then training under torchrun.
    "python -m venv .venv && . .venv/bin/activate": "scripts/check_pip_install.sh",
    "pip install torch==2.13.0 cmake ninja setuptools wheel": "scripts/check_pip_install.sh",
    "pip install --no-build-isolation .": "scripts/check_pip_install.sh",
    # quickstart.sh installs (scripts/install.sh, which scripts/test.sh runs first), then runs this
    # job with 4 processes; the test runs the same job with 2 processes and 3 steps.
    "bash scripts/quickstart.sh": "engine/test_parallelize.py::test_readme_training_job_runs_under_torchrun",
    "torchrun --standalone --nproc-per-node 4 -m shardwise train":
        "engine/test_parallelize.py::test_readme_training_job_runs_under_torchrun",
    # The README's train.py: the python block with init_process_group, as written.
    "torchrun --nproc-per-node 4 train.py":
        "docs/test_readme.py::test_the_training_script_and_its_checkpoint_lines_run_under_torchrun",
}
# Where CI runs commands: .ci/run, and every script it reaches through `bash scripts/NAME.sh`.
CI_ENTRY = ".ci/run"


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # the HTML comment on the line before the fence, without <!-- -->; "" if none
    text: str


def _blocks() -> list[Block]:
    lines = README.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)", lines[i])
        if not m:
            i += 1
            continue
        before = lines[i - 1].strip() if i else ""
        marker = re.fullmatch(r"<!--\s*(.*?)\s*-->", before)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        assert j < len(lines), f"README.md:{i + 1}: unclosed code block"
        out.append(Block(i + 1, m.group(1), marker.group(1) if marker else "",
                         "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return out


def _python(marker: str = "") -> list[Block]:
    return [b for b in _blocks() if b.lang == "python" and b.marker == marker]


# ---- the training script ------------------------------------------------------------------------

def _training_page_checkpoint_block() -> str:
    """docs/training.md's checkpoint lines (a ```python torchrun block)."""
    text = (ROOT / "docs" / "training.md").read_text()
    blocks = [b for b in re.findall(r"```python torchrun\n(.*?)```", text, flags=re.S) if "save_checkpoint" in b]
    assert len(blocks) == 1, "docs/training.md's checkpoint block"
    return blocks[0]


def test_the_training_script_and_its_checkpoint_lines_run_under_torchrun(tmp_path):
    train = [b.text for b in _python() if "init_process_group" in b.text]
    assert len(train) == 1, "the README's training block (python, unmarked, with init_process_group)"
    checkpoint = [_training_page_checkpoint_block()]
    assert "shardwise.local_device()" in train[0] and "shardwise.backend_for(" in train[0]
    # The script destroys its process group before it exits, as torch asks (a Gloo rank that
    # exits with its groups alive may abort in teardown); the checkpoint lines go before that.
    lines = train[0].splitlines(keepends=True)
    teardown = [line for line in lines if line.startswith("dist.destroy_process_group()")]
    assert teardown and lines[-1] == teardown[0], "the README's training block ends with dist.destroy_process_group()"
    # One write per rank (print writes the line and its newline apart: ranks interleave them).
    (tmp_path / "train.py").write_text("".join(lines[:-1]) + checkpoint[0]
                                       + "import sys; sys.stdout.write(f'checkpoint step {step}\\n')\n"
                                       + teardown[0])
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                                      os.environ.get("PYTHONPATH")]))}
    # The README's command, with --standalone so that parallel test runs take free ports.
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", "train.py"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "predicted step" in out.stdout and "def forward" in out.stdout  # the report and the program
    assert out.stdout.count("step 4: loss") == 1  # rank 0 prints each step's loss
    assert out.stdout.count("checkpoint step 5") == 4  # every rank loaded it back
    assert (tmp_path / "ckpt" / ".metadata").exists()


# ---- length and first screen --------------------------------------------------------------------

def test_the_readme_is_short_and_its_first_screen_installs_runs_and_tests():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, at most {MAX_LINES}: move prose to docs/"
    first = "\n".join(lines[:FIRST_SCREEN])
    for command in ("pip install --no-build-isolation .",       # install
                    "torchrun --standalone --nproc-per-node 4 -m shardwise train",
                    "bash scripts/quickstart.sh",                # the main job
                    "bash scripts/test.sh"):                     # the tests
        assert command in first, f"{command!r} is not in the README's first {FIRST_SCREEN} lines"


# ---- the layout table ---------------------------------------------------------------------------

def _ignored(name: str) -> bool:
    """Whether .gitignore ignores a top-level folder (build outputs: build/, dist/, ...)."""
    patterns = [p.strip() for p in (ROOT / ".gitignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    return any(fnmatch.fnmatch(name, p.strip("/")) for p in patterns if p.endswith("/"))


def _layout_paths() -> list[str]:
    text = README.read_text()
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert section, "README.md has no '## Layout' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")][2:]  # header, rule
    assert rows, "the layout section has no table"
    return [p.rstrip("/") for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_the_layout_table_lists_the_folders_that_exist():
    paths = _layout_paths()
    missing = [p for p in paths if not (ROOT / p).is_dir()]
    assert not missing, f"the README's layout table names folders that do not exist: {missing}"
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and not _ignored(p.name)}
    listed_top = {p.split("/")[0] for p in paths}
    assert listed_top == top, (f"top-level folders not in the layout table: {sorted(top - listed_top)}; "
                               f"in the table but not in the tree: {sorted(listed_top - top)}")
    layers = {p.name for p in (ROOT / "csrc").iterdir() if p.is_dir()}
    listed_layers = {p.split("/")[1] for p in paths if p.startswith("csrc/") and p.count("/") == 1}
    assert listed_layers == layers, (f"csrc/ layers not in the layout table: {sorted(layers - listed_layers)}; "
                                     f"in the table but not in csrc/: {sorted(listed_layers - layers)}")


TESTS = ROOT / "tests" / "python"


def _test_areas() -> dict[str, list[str]]:
    """tests/python/README.md's table: each test folder -> the package paths it names (under
    python/shardwise; a parenthesised cell names the project's own folders instead)."""
    rows = [line for line in (TESTS / "README.md").read_text().splitlines() if line.startswith("| `")]
    assert rows, "tests/python/README.md has no table of test folders"
    areas = {}
    for row in rows:
        folder, package = row.split("|")[1:3]
        areas[folder.strip().strip("`")] = [] if "(" in package else re.findall(r"`([^`]+)`", package)
    return areas


def test_the_test_folders_are_the_package_areas_their_table_names():
    areas = _test_areas()
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert set(areas) == folders, (f"test folders not in tests/python/README.md: {sorted(folders - set(areas))}; "
                                   f"in its table but not in the tree: {sorted(set(areas) - folders)}")
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files outside an area folder of tests/python: {loose}"
    empty = sorted(a for a in areas if not list((TESTS / a).glob("test_*.py")))
    assert not empty, f"test folders with no test file: {empty}"
    package = ROOT / "python" / "shardwise"
    missing = sorted(f"{a}: {p}" for a, paths in areas.items() for p in paths if not (package / p).exists())
    assert not missing, f"tests/python/README.md names package paths that do not exist: {missing}"


# ---- every shell command runs somewhere ---------------------------------------------------------

def _normalise(command: str) -> str:
    """One spelling per command: `$PY -m pip` / `python3 -m pip` are pip, `-m torch.distributed.run`
    is torchrun, quotes and repeated spaces go."""
    c = " ".join(command.replace('"', "").replace("'", "").split())
    c = re.sub(r"(\$\{?PY(THON)?(:-python3)?\}?|python3?|\$\{PYTHON:-python3\}) -m pip\b", "pip", c)
    c = re.sub(r"(\$\{?PY(THON)?(:-python3)?\}?|python3?) -m torch\.distributed\.run\b", "torchrun", c)
    return c


def _shell_commands(block: Block) -> list[str]:
    out = []
    for line in block.text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split("#")[0].split()
        if words:
            out.append(" ".join(words))
    return out


def _ci_lines() -> dict[str, str]:
    """Every line of the scripts CI runs (normalised) -> the script, following `bash scripts/X.sh`."""
    lines, todo, seen = {}, [CI_ENTRY], set()
    while todo:
        script = todo.pop()
        if script in seen or not (ROOT / script).exists():
            continue
        seen.add(script)
        for line in (ROOT / script).read_text().splitlines():
            line = line.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            lines[_normalise(line)] = script
            todo += re.findall(r"\bbash (scripts/[\w.-]+\.sh)", line)
    return lines


def _test_exists(target: str) -> bool:
    if target.startswith("scripts/"):
        return (ROOT / target).is_file()
    module, _, function = target.partition("::")
    path = ROOT / "tests" / "python" / module
    return path.exists() and re.search(rf"^def {re.escape(function)}\(", path.read_text(), flags=re.M) is not None


def test_the_run_by_map_names_tests_that_exist():
    for command, target in RUN_BY.items():
        assert _test_exists(target), f"RUN_BY[{command!r}] = {target!r}: no such test or script"


def test_every_shell_command_runs_in_ci_or_a_test_or_is_marked_gpu_only():
    lines = _ci_lines()
    ci = set(lines.values())
    shown, unrun = [], []
    for block in _blocks():
        if block.lang not in ("bash", "sh", "shell", "console"):
            continue
        for command in _shell_commands(block):
            shown.append(command)
            if block.marker == "gpu-only":
                continue
            target = RUN_BY.get(command)
            if target is not None and not target.startswith("scripts/"):
                continue  # a test runs it (test_the_run_by_map_names_tests_that_exist)
            if target is not None and target in ci:
                continue
            if target is not None:
                unrun.append(f"README.md:{block.line}: {command}   (RUN_BY: {target}, which CI does not run)")
                continue
            if any(_normalise(command) in line for line in lines):
                continue
            unrun.append(f"README.md:{block.line}: {command}")
    assert shown, "the README shows no shell command"
    stale = sorted(set(RUN_BY) - set(shown))
    assert not stale, f"RUN_BY names commands the README no longer shows: {stale}"
    assert not unrun, ("shell commands of the README that nothing runs: run each in CI (.ci/run, "
                       "scripts/test.sh or a script it runs), add it to RUN_BY with the test that runs it, "
                       "or mark its block <!-- gpu-only -->:\n  " + "\n  ".join(unrun))


# ---- blocks that are files ----------------------------------------------------------------------

def test_blocks_marked_as_files_are_those_files():
    marked = [b for b in _blocks() if b.marker.startswith("file:")]
    assert marked, "the README shows no <!-- file: PATH --> block (examples/hf_trainer.py)"
    for block in marked:
        path = block.marker.removeprefix("file:").strip()
        assert (ROOT / path).is_file(), f"README.md:{block.line}: shows {path}, which does not exist"
        assert block.text.rstrip("\n") == (ROOT / path).read_text().rstrip("\n"), (
            f"README.md:{block.line}: the block is not {path} as the file holds it; paste the file")


def test_the_readme_names_only_importable_shardwise_attributes():
    """The shardwise names the README's Python calls exist (the GPU-only and file blocks included)."""
    import shardwise

    for block in _blocks():
        if block.lang != "python":
            continue
        for dotted in sorted(set(re.findall(r"\bshardwise((?:\.\w+)+)", block.text))):
            parts = dotted.strip(".").split(".")
            obj, name = shardwise, "shardwise"
            for part in parts:
                name += "." + part
                if hasattr(obj, part):
                    obj = getattr(obj, part)
                    continue
                try:
                    obj = importlib.import_module(name)
                except ImportError:
                    pytest.fail(f"README.md:{block.line}: {name} does not exist")
