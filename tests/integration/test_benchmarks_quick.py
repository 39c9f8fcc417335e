"""The gateway benchmarks' --quick modes run end to end and write their results.

Runs first among the integration tests (file order), before the session's gateway starts:
the benchmark starts and stops its own ``rmgate serve``. Numbers are never asserted,
except the one fact the benchmark exists to show: rmgate's replays never differ.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration


def test_side_by_side_quick(demo_models, tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "side_by_side.py"), "--quick",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "side_by_side.json").read_text())
    assert set(report["overhead"]) == {"disrm", "grm"}
    for rows in report["overhead"].values():
        for row in rows.values():
            assert {"a_engines", "b_least_loaded", "c_rmgate", "ratios"} <= set(row)
    assert report["determinism"]["c_rmgate"]["any_differing"] == 0
    assert report["startup"]["to_first_200_s"] > 0 and report["startup"]["rss_mib"]
    assert (tmp_path / "side_by_side.png").stat().st_size > 10_000
