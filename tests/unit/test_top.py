"""``rmgate top``: the frame drawn from a canned gateway (an in-process ``httpx.MockTransport``
answering ``/v1/models``, two different ``/metrics`` scrapes and ``/v1/audit``), compared
with a committed snapshot, and a frame that still draws when an endpoint fails.

Regenerate the snapshot with ``RMGATE_UPDATE_SNAPSHOTS=1`` (then read its diff).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.cli.top import Fetcher, Poller, once, watch
from gateway.cli.top_metrics import Scrape, parse_scrape, rates
from gateway.cli.top_view import render, to_text

SNAPSHOT = Path(__file__).parent / "snapshots" / "top_once.txt"
URL = "http://gw.test"
NOW = 1_700_000_100.0  # wall clock of the frames: audit events are aged against it
JUDGE_CLASS, RM_CLASS, LARGE_CLASS = "5f0c2a9e1b7d", "a1b2c3d4e5f6", "0e9d8c7b6a54"


def slot_state(slot: int, state: str = "awake", **extra: Any) -> dict[str, Any]:
    """A slot's report as ``/v1/models`` carries it (``deployments/slot/lifecycle.py``)."""
    return {
        "slot": slot,
        "state": state,
        "is_sleeping": state in ("asleep", "sleeping"),
        "level": None,
        "slept_by": None,
        "how": None,
        "kept_out": None,
        "last": {},
        **extra,
    }


def card(name: str, kind: str, classes: list[str | None], **extra: Any) -> dict[str, Any]:
    """A ``ModelCard`` (``gateway/core/api/schemas.py``) with the fields ``top`` reads."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(classes):
        if c is not None:
            groups.setdefault(c, []).append(i)
    return {
        "id": name,
        "object": "model",
        "kind": kind,
        "determinism": "serialize",
        "slots": len(classes),
        "fingerprints": [f"fp-{name}-{i}" for i in range(len(classes))],
        "health": ["healthy"] * len(classes),
        "placement": "class",
        "numerics_classes": classes,
        "classes": groups,
        "drained": {},
        "state": "awake",
        "slot_states": [slot_state(i) for i in range(len(classes))],
        "autoscaling": None,
        **extra,
    }


MODELS = {
    "object": "list",
    "data": [
        card(
            "judge",
            "generative",
            [JUDGE_CLASS, JUDGE_CLASS],
            drained={"1": "audit: answered differently from its class"},
        ),
        card(
            "rm",
            "discriminative",
            [RM_CLASS, RM_CLASS],
            state="mixed",
            slot_states=[
                slot_state(0),
                slot_state(1, "asleep", level=1, slept_by="user", how="stopped"),
            ],
        ),
        card(
            "rm-large",
            "discriminative",
            [LARGE_CLASS],
            state="scaling",
            autoscaling={
                "min_slots": 0,
                "max_slots": 2,
                "target_ongoing_per_slot": 2.0,
                "scaling": {"to": 2},
                "decisions": [],
            },
        ),
    ],
    "programs": [{"name": "math", "components": []}],
}

AUDIT = {
    "enabled": True,
    "sample": 0.05,
    "max_per_minute": 60,
    "queued": 2,
    "classes": [
        {
            "model": "judge",
            "numerics_class": JUDGE_CLASS,
            "same": 41,
            "different": 1,
            "failed": 0,
            "suspect": True,
        },
        {
            "model": "rm",
            "numerics_class": RM_CLASS,
            "same": 120,
            "different": 0,
            "failed": 2,
            "suspect": False,
        },
    ],
    "drained": [
        {
            "model": "judge",
            "slot": 1,
            "numerics_class": JUDGE_CLASS,
            "receipt": "r-9f31",
            "at": NOW - 42,
        }
    ],
    "last_mismatch": {
        "model": "judge",
        "numerics_class": JUDGE_CLASS,
        "receipt": "r-9f31",
        "recorded_slot": 0,
        "audit_slot": 1,
        "at": NOW - 45,
        "verdict": "different",
    },
}


def metrics_text(
    requests: dict[tuple[str, str, str], float],
    cache: dict[tuple[str, str], float],
    inflight: dict[tuple[str, int], float],
    queued: dict[tuple[str, int], float],
    buffered: float,
    dropped: float,
    written: float,
) -> str:
    """``GET /metrics`` as prometheus_client writes it (``_total`` and ``_created`` samples,
    HELP and TYPE lines), for the series ``top`` reads and one it does not."""
    out = [
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 12.5",
        "# HELP rmgate_requests_total HTTP requests answered by the gateway",
        "# TYPE rmgate_requests_total counter",
    ]
    for (model, endpoint, status), v in requests.items():
        labels = f'model="{model}",endpoint="{endpoint}",status="{status}"'
        out += [
            f"rmgate_requests_total{{{labels}}} {v}",
            f"rmgate_requests_created{{{labels}}} 1.7e9",
        ]
    out += ["# HELP rmgate_slot_inflight Engine requests in flight per slot"]
    out += ["# TYPE rmgate_slot_inflight gauge"]
    out += [f'rmgate_slot_inflight{{model="{m}",slot="{s}"}} {v}' for (m, s), v in inflight.items()]
    out += ["# HELP rmgate_slot_queued Requests waiting for a slot's gate"]
    out += ["# TYPE rmgate_slot_queued gauge"]
    out += [f'rmgate_slot_queued{{model="{m}",slot="{s}"}} {v}' for (m, s), v in queued.items()]
    out += ["# HELP rmgate_ledger_rows_written_total Rows written to the reward ledger"]
    out += ["# TYPE rmgate_ledger_rows_written_total counter"]
    out += [f"rmgate_ledger_rows_written_total {written}"]
    out += ["# HELP rmgate_ledger_rows_dropped_total Rows not recorded"]
    out += ["# TYPE rmgate_ledger_rows_dropped_total counter"]
    out += [f"rmgate_ledger_rows_dropped_total {dropped}"]
    out += ["# HELP rmgate_ledger_buffered Rows waiting for the ledger's writer"]
    out += ["# TYPE rmgate_ledger_buffered gauge", f"rmgate_ledger_buffered {buffered}"]
    out += ["# HELP rmgate_cache_total Engine requests by how the ledger's cache answered them"]
    out += ["# TYPE rmgate_cache_total counter"]
    for (model, outcome), v in cache.items():
        out += [f'rmgate_cache_total{{model="{model}",outcome="{outcome}"}} {v}']
    return "\n".join(out) + "\n"


#: Two scrapes 0.5 s apart: judge +10 answered (+1 of them a 503), rm +20, math +5, a 404
#: without a model +1; rm's cache +12 hit, +3 shared, +5 miss in between.
SCRAPES = [
    metrics_text(
        requests={
            ("judge", "/v1/chat/completions", "200"): 100,
            ("judge", "/v1/chat/completions", "503"): 4,
            ("rm", "/classify", "200"): 300,
            ("math", "/v1/rewards", "200"): 50,
            ("", "/nope", "404"): 3,
        },
        cache={
            ("rm", "hit"): 100,
            ("rm", "shared"): 10,
            ("rm", "miss"): 90,
            ("judge", "miss"): 104,
        },
        inflight={("judge", 0): 1, ("judge", 1): 0, ("rm", 0): 2, ("rm", 1): 0, ("rm-large", 0): 0},
        queued={("judge", 0): 0, ("judge", 1): 0, ("rm", 0): 1, ("rm", 1): 0, ("rm-large", 0): 0},
        buffered=0,
        dropped=0,
        written=500,
    ),
    metrics_text(
        requests={
            ("judge", "/v1/chat/completions", "200"): 109,
            ("judge", "/v1/chat/completions", "503"): 5,
            ("rm", "/classify", "200"): 320,
            ("math", "/v1/rewards", "200"): 55,
            ("", "/nope", "404"): 4,
        },
        cache={
            ("rm", "hit"): 112,
            ("rm", "shared"): 13,
            ("rm", "miss"): 95,
            ("judge", "miss"): 114,
        },
        inflight={("judge", 0): 3, ("judge", 1): 0, ("rm", 0): 4, ("rm", 1): 0, ("rm-large", 0): 1},
        queued={("judge", 0): 2, ("judge", 1): 0, ("rm", 0): 5, ("rm", 1): 0, ("rm-large", 0): 0},
        buffered=7,
        dropped=0,
        written=530,
    ),
]


class FakeClock:
    """Monotonic time that moves only when slept: the rates are exact."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


Handler = Callable[[httpx.Request], httpx.Response]


def gateway(
    metrics: Handler | None = None, audit: Handler | None = None, models: Handler | None = None
) -> tuple[httpx.MockTransport, list[str]]:
    """A canned gateway; ``metrics``/``audit``/``models`` replace an endpoint's answer. The
    paths asked, in order, are recorded."""
    asked: list[str] = []
    scrapes = iter(SCRAPES)

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        asked.append(path)
        if path == "/metrics":
            return metrics(request) if metrics else httpx.Response(200, text=next(scrapes))
        if path == "/v1/models":
            return models(request) if models else httpx.Response(200, json=MODELS)
        if path == "/v1/audit":
            return audit(request) if audit else httpx.Response(200, json=AUDIT)
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handle), asked


def frame_once(transport: httpx.MockTransport, interval: float = 0.5) -> tuple[str, Any]:
    clock = FakeClock()
    poller = Poller(
        Fetcher(URL, api_key="k-1", transport=transport),
        URL,
        interval,
        clock=clock.now,
        wall=lambda: NOW,
    )
    view = once(poller, sleep=clock.sleep)
    return to_text(render(view), width=120), view


def test_once_frame_matches_the_snapshot():
    transport, asked = gateway()
    text, view = frame_once(transport)
    assert asked == ["/metrics", "/v1/models", "/v1/audit"] * 2
    if os.environ.get("RMGATE_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8")
    # the numbers the snapshot shows, from the two scrapes 0.5 s apart
    assert view.rates.requests["judge"] == pytest.approx(20.0)
    assert view.rates.errors["judge"] == pytest.approx(2.0)
    assert view.rates.cache_hit["rm"] == pytest.approx(0.75)


def test_the_api_key_is_sent_as_a_bearer_token():
    seen: list[str | None] = []

    def models(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json=MODELS)

    transport, _ = gateway(models=models)
    frame_once(transport)
    assert seen == ["Bearer k-1", "Bearer k-1"]


def test_an_older_gateway_without_audit_shows_audit_unavailable():
    transport, _ = gateway(audit=lambda r: httpx.Response(404, json={"detail": "Not Found"}))
    text, view = frame_once(transport)
    assert "audit: unavailable (this gateway has no /v1/audit)" in text
    assert view.errors == []  # not an error: the rest of the frame as usual
    assert "judge-1" in text and "20.0" in text


def test_a_failing_audit_shows_unavailable_and_why():
    transport, _ = gateway(audit=lambda r: httpx.Response(500, text="boom"))
    text, _ = frame_once(transport)
    assert "audit: unavailable (HTTP 500 boom)" in text


def test_audit_off():
    transport, _ = gateway(audit=lambda r: httpx.Response(200, json={**AUDIT, "enabled": False}))
    text, _ = frame_once(transport)
    assert "audit: off" in text and "SUSPECT" not in text


def test_failing_metrics_show_an_error_line_and_the_models_still():
    transport, _ = gateway(metrics=lambda r: httpx.Response(500, text="Internal Server Error"))
    text, view = frame_once(transport)
    assert view.errors == ["GET /metrics: HTTP 500 Internal Server Error"]
    assert "error: GET /metrics: HTTP 500 Internal Server Error" in text
    assert view.scrape is None and view.rates is None
    assert "requests: - (rates from the next scrape)" in text and "ledger: -" in text
    for name in ("judge-0", "judge-1", "rm-0", "rm-1", "rm-large-0"):
        assert name in text
    assert "audit: on" in text


def test_metrics_that_are_not_prometheus_text_are_an_error_line():
    transport, _ = gateway(metrics=lambda r: httpx.Response(200, text="<html>{oops</html>\n"))
    text, view = frame_once(transport)
    assert view.scrape is None
    assert any(e.startswith("GET /metrics: not Prometheus text") for e in view.errors)


def test_unreachable_models_leave_the_rest_of_the_frame():
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    transport, _ = gateway(models=refused)
    text, view = frame_once(transport)
    assert view.models is None
    assert "error: GET /v1/models: ConnectError: connection refused" in text
    assert "requests: 72.0/s" in text and "audit: on" in text


def test_a_failed_scrape_between_two_good_ones_is_spanned_by_the_next_rate():
    answers = iter(
        [
            httpx.Response(200, text=SCRAPES[0]),
            httpx.Response(502, text="bad gateway"),
            httpx.Response(200, text=SCRAPES[1]),
        ]
    )
    transport, _ = gateway(metrics=lambda r: next(answers))
    clock = FakeClock()
    poller = Poller(Fetcher(URL, transport=transport), URL, 0.5, clock=clock.now)
    views = []
    for _ in range(3):
        views.append(poller.tick())
        clock.sleep(0.5)
    assert views[1].errors == ["GET /metrics: HTTP 502 bad gateway"] and views[1].rates is None
    assert views[2].rates.seconds == pytest.approx(1.0)
    assert views[2].rates.requests["rm"] == pytest.approx(20.0)


def test_a_counter_that_went_down_is_counted_from_zero():
    before = parse_scrape(SCRAPES[1], at=0.0)
    after = parse_scrape(SCRAPES[0], at=2.0)  # a restarted replica: totals lower
    between = rates(before, after)
    assert between.requests["rm"] == pytest.approx(300 / 2)
    assert rates(before, before) is None  # no time passed: no rate
    assert rates(Scrape(at=0.0), after).ledger_written == pytest.approx(250.0)


def test_parse_reads_the_shown_series():
    scrape = parse_scrape(SCRAPES[1], at=0.0)
    assert scrape.requests == {"judge": 114, "rm": 320, "math": 55, "": 4}
    assert scrape.errors == {"judge": 5}
    assert scrape.inflight[("rm", 0)] == 4 and scrape.queued[("rm", 0)] == 5
    assert (scrape.ledger_buffered, scrape.ledger_dropped, scrape.ledger_written) == (7, 0, 530)


def test_the_live_view_redraws_until_ctrl_c():
    transport, _ = gateway()
    ticks: list[float] = []

    def sleep(seconds: float) -> None:
        ticks.append(seconds)
        if len(ticks) == 2:
            raise KeyboardInterrupt

    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, color_system=None)
    poller = Poller(Fetcher(URL, transport=transport), URL, 0.5)
    with pytest.raises(KeyboardInterrupt):
        watch(poller, console, sleep=sleep)
    assert ticks == [0.5, 0.5]
    out = buffer.getvalue()
    assert "rm-large-0" in out and "req/s" in out and "audit: on" in out


def test_the_command_against_nothing_prints_the_errors_and_exits_1():
    """The real command (real HTTP, real sleep) against a port nobody listens on."""
    res = CliRunner().invoke(app, ["top", "http://127.0.0.1:9", "--once", "--interval", "0.1"])
    assert res.exit_code == 1, res.output
    assert "error: GET /metrics: ConnectError" in res.output
    assert "error: GET /v1/models: ConnectError" in res.output
    assert "audit: unavailable" in res.output
