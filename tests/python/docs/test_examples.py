"""Every example in examples/ runs as its docstring says (CPU, small sizes)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import shardwise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLES = os.path.join(ROOT, "examples")


def _run(args: list[str], cwd) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(shardwise.__path__[0]),
                                                                     os.environ.get("PYTHONPATH")])))
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _torchrun(script: str, cwd) -> str:
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 os.path.join(EXAMPLES, script)], cwd)


def test_plan_gpt3(tmp_path):
    out = _run([sys.executable, os.path.join(EXAMPLES, "plan_gpt3.py"), str(tmp_path / "t.svg")], tmp_path)
    assert "planned in" in out and "predicted step" in out
    assert (tmp_path / "t.svg").read_text().count("<svg") == 1


def test_heterogeneous(tmp_path):
    out = _run([sys.executable, os.path.join(EXAMPLES, "heterogeneous.py")], tmp_path)
    assert "batch shares per rank" in out


def test_edit_plan(tmp_path):
    out = _torchrun("edit_plan.py", tmp_path)
    assert "step 2: loss" in out and "gpipe, micro-batch 2" in out


@pytest.mark.slow
def test_train_gpt2(tmp_path):
    pytest.importorskip("transformers")
    out = _torchrun("train_gpt2.py", tmp_path)
    assert "step 2: loss" in out and "predicted step" in out
