"""The README's main job and the CLI, run as a user runs them."""
import subprocess
import sys


def test_inspect_prints_the_summary_of_the_builtin_model(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "tiny-gpt", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "captured tiny-gpt" in proc.stdout
    assert "blocks" in proc.stdout
    assert out.read_text().startswith("{")


def test_inspect_reports_a_bad_model_spec_as_an_error():
    proc = subprocess.run([sys.executable, "-m", "shardwise", "inspect", "no-such-model"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "unknown model spec" in proc.stderr
