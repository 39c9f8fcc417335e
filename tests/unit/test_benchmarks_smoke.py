"""Benchmarks' --quick modes run and write their results (numbers are never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scaling_hash_quick(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.scaling_hash", "--quick",
                          "--max-slots", "4", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "scaling_hash.json").read_text())
    assert [r["n"] for r in rows] == [1, 2, 3, 4]
    assert (tmp_path / "scaling_hash.png").stat().st_size > 10_000
