"""The README's Python, run as written: the training script (with the checkpoint lines that
follow it) under torchrun, and the planning blocks in one session, in order, as a reader
would paste them. (The CLI lines: test_cli.py; the examples: test_examples.py.)"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_training_script_and_its_checkpoint_lines_run_under_torchrun(tmp_path):
    blocks = _python_blocks()
    train = [b for b in blocks if "init_process_group" in b]
    checkpoint = [b for b in blocks if "save_checkpoint" in b]
    assert len(train) == 1 and len(checkpoint) == 1, "the README's training and checkpoint blocks"
    # One write per rank (print writes the line and its newline apart: ranks interleave them).
    (tmp_path / "train.py").write_text(train[0] + checkpoint[0]
                                       + "import sys; sys.stdout.write(f'checkpoint step {step}\\n')\n")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(README.parent / "python"),
                                                                      os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", "train.py"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "predicted step" in out.stdout and "def forward" in out.stdout  # the report and the program
    assert out.stdout.count("checkpoint step 5") == 4  # every rank loaded it back
    assert (tmp_path / "ckpt" / ".metadata").exists()


def test_the_planning_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = [b for b in _python_blocks() if "init_process_group" not in b and "save_checkpoint" not in b]
    assert len(blocks) >= 4
    session: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), session)  # noqa: S102 - the README's own code
    assert (tmp_path / "gpt2-xl.json").exists() and (tmp_path / "timeline.svg").exists()
    print("README blocks ran:", len(blocks), file=sys.stderr)
