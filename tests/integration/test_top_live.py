"""``rmgate top --once`` against the session gateway: the installed command reads the real
``/v1/models``, ``/metrics`` and ``/v1/audit`` and its frame names every model of
``configs/test-cpu.yaml``, every slot, and the rate and cache columns. Structure, not
numbers: the other tests' traffic decides those."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = REPO / "configs" / "test-cpu.yaml"


def configured() -> tuple[list[str], list[str]]:
    """(model names, reward program names) of the session config."""
    args = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["applications"][0]["args"]
    return [m["name"] for m in args["models"]], [p["name"] for p in args.get("programs") or []]


def test_top_once_shows_every_model_slot_and_the_rate_columns(gateway):
    url, _ = gateway
    # traffic first, so the request and cache series exist in /metrics
    for text in ("2+3=5", "2+3=6"):
        r = httpx.post(url + "/classify", json={"model": "rm", "input": [text]}, timeout=120)
        assert r.status_code == 200, r.text
    cards = {c["id"]: c for c in httpx.get(url + "/v1/models", timeout=60).json()["data"]}
    models, programs = configured()
    assert set(models) <= set(cards)

    res = subprocess.run(
        [str(BIN / "rmgate"), "top", url, "--once", "--interval", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    frame = res.stdout
    assert res.returncode == 0, frame + res.stderr
    assert "error:" not in frame, frame

    header = next(line for line in frame.splitlines() if line.strip().startswith("model "))
    for column in ("state", "classes", "req/s", "err/s", "cache hit", "hit total"):
        assert column in header, header
    assert re.search(r"^requests: [0-9.]+/s, errors: [0-9.]+/s over ", frame, re.MULTILINE)
    assert re.search(r"ledger: \d+ buffered, \d+ dropped", frame), frame
    assert re.search(r"^audit: (on|off|unavailable)", frame, re.MULTILINE), frame

    model_rows, slot_rows = section(frame, "models", "slots"), section(frame, "slots", "audit:")
    for name in models:
        # the model's row: its kind and a rate (a number, not "-": two scrapes were made)
        assert name in model_rows, frame
        assert cards[name]["kind"] in model_rows[name]
        assert re.search(r"\s\d+\.\d\s", model_rows[name]), model_rows[name]
        for slot in range(cards[name]["slots"]):
            assert f"{name}-{slot}" in slot_rows, f"{name}-{slot} missing:\n{frame}"
            klass = cards[name]["numerics_classes"][slot]
            if klass:
                assert klass in slot_rows[f"{name}-{slot}"]
    for name in programs:
        assert name in model_rows and "program" in model_rows[name], frame


def section(frame: str, title: str, until: str) -> dict[str, str]:
    """The rows of the table titled ``title`` (up to the line starting with ``until``), by
    their first word."""
    lines = frame.splitlines()
    start = lines.index(title) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(until))
    return {line.split()[0]: line for line in lines[start:end] if line.strip()}
