"""The gateway benchmarks' --quick modes run end to end and write their results.

Opt-in (``RMGATE_BENCH_SMOKE=1``, docs/testing.md): each starts and stops its own
``rmgate serve`` and engines (4-5 minutes each on two cores), and what they exercise
is tested in the default suite already (every path: engines, HAProxy, Serve's proxy; the
CPU accounting in tests/unit). Numbers are never asserted, except the one fact the
benchmark exists to show: rmgate's replays never differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration

#: The benchmarks' quick modes (~4 min each, each its own gateway) run with
#: RMGATE_BENCH_SMOKE=1: the default suite stays under its 35 minutes with the install.
bench_smoke = pytest.mark.skipif(
    os.environ.get("RMGATE_BENCH_SMOKE") != "1",
    reason="benchmark smoke test; RMGATE_BENCH_SMOKE=1 runs it (docs/testing.md)",
)


@bench_smoke
def test_side_by_side_quick(demo_models, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.side_by_side", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "side_by_side.json").read_text())
    assert set(report["overhead"]) == {"disrm", "grm"}
    for rows in report["overhead"].values():
        for row in rows.values():
            assert {
                "a_engines",
                "b_least_loaded",
                "c_rmgate",
                "d_rmgate_serve_proxy",
                "ratios",
            } <= set(row)
            # the CPU accounting found each path's own gateway processes
            assert row["b_least_loaded"]["gateway_cpu_ms_per_req"] > 0
            assert row["c_rmgate"]["cpu_ms_per_req"]["ingress"] > 0
            assert row["d_rmgate_serve_proxy"]["cpu_ms_per_req"]["http_proxy"] > 0
    assert report["determinism"]["c_rmgate"]["any_differing"] == 0
    assert report["startup"]["to_first_200_s"] > 0 and report["startup"]["rss_mib"]
    assert (tmp_path / "side_by_side.png").stat().st_size > 10_000


@bench_smoke
def test_replica_throughput_quick(demo_models, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.replica_throughput", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "replica_throughput.json").read_text())
    rows = report["variants"]["own-cores"]["by_replicas"]
    assert list(rows) == ["1", "2"]
    assert set(rows["2"]["requests_per_slot"]) == {"0", "1"}
    assert report["identical_at_every_count"] is True  # same bits at 1 and 2 replicas
    assert (tmp_path / "replica_throughput.png").stat().st_size > 10_000


@bench_smoke
def test_hops_quick(demo_models, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.hops", "--quick", "--out", str(tmp_path / "hops.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "hops.json").read_text())
    assert set(report["paths"]) == {"engine", "rmgate-direct", "rmgate-handle"}
    assert report["requests_per_path"] == 40
