"""Benchmarks' --quick modes run and write their results (numbers are never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scaling_hash_quick(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.scaling_hash",
            "--quick",
            "--max-slots",
            "4",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "scaling_hash.json").read_text())
    assert [r["n"] for r in rows] == [1, 2, 3, 4]
    assert (tmp_path / "scaling_hash.png").stat().st_size > 10_000


def test_disconnects_summary_counts_each_hop_over_the_attempts_that_measured_it():
    from benchmarks.disconnects import summary

    rows = [
        {"target": "engine", "stopped_early": True},
        {"target": "engine", "stopped_early": False},
        {
            "target": "rmgate",
            "stopped_early": True,
            "gateway_noticed": True,
            "deadline_ended": False,
            "haproxy_noticed": None,
        },
        {
            "target": "rmgate",
            "stopped_early": False,
            "gateway_noticed": False,
            "deadline_ended": True,
            "haproxy_noticed": False,
        },
    ]
    assert summary(rows) == {
        "engine_directly_stopped_early": "1/2",
        "haproxy_noticed": "0/1",
        "gateway_noticed": "1/2",
        "deadline_ended": "1/2",
        "through_rmgate_stopped_early": "1/2",
    }
