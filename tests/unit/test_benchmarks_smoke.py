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


def test_grpo_groups_share_a_prompt_within_a_group_and_nothing_across():
    from benchmarks.groups import grpo_groups

    groups = grpo_groups(1, 3, 16, 800, 60)
    again = grpo_groups(2, 3, 16, 800, 60)
    for g in groups:
        assert len({it["prompt"] for it in g}) == 1 and len({it["group"] for it in g}) == 1
        assert len(g[0]["prompt"]) == 800 and all(len(it["response"]) == 60 for it in g)
        assert len({it["response"] for it in g}) == 16
    prompts = [g[0]["prompt"] for g in groups + again]
    # no two groups (nor two rounds) share even the first cache block of a prompt
    assert len({p[:128] for p in prompts}) == len(prompts)
