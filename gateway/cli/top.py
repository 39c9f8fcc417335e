"""``rmgate top``: a running gateway, live, for the person at the console.

Each tick fetches ``GET /metrics``, ``GET /v1/models`` and ``GET /v1/audit`` and redraws
the frame (``top_view``). Nothing the gateway answers, or fails to answer, stops the loop:
a failed endpoint becomes an error line in that tick's frame and is asked again on the
next one, because the moment an operator watches is often the moment something is wrong.
Rates need two scrapes, so ``--once`` scrapes twice, ``--interval`` apart.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.live import Live

from gateway.cli.elastic import API_KEY, URL
from gateway.cli.top_metrics import Scrape, parse_scrape, rates
from gateway.cli.top_view import View, render, to_text

#: Longest text of an answer quoted in an error line.
QUOTE_CHARS = 160


@dataclass
class Fetched:
    """One tick's answers: ``None`` where an endpoint failed (``errors`` says how), except
    the audit, which only notes why it is missing (older gateways have no ``/v1/audit``)."""

    metrics: str | None = None
    models: list[dict[str, Any]] | None = None
    programs: list[dict[str, Any]] = field(default_factory=list)
    audit: dict[str, Any] | None = None
    audit_note: str | None = None
    errors: list[str] = field(default_factory=list)


def _why(exc: Exception) -> str:
    text = str(exc) if isinstance(exc, httpx.HTTPStatusError) else f"{type(exc).__name__}: {exc}"
    return text.replace("\n", " ")[:QUOTE_CHARS]


class Fetcher:
    """GETs the three endpoints of one gateway (``transport``: the tests' in-process one)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    def close(self) -> None:
        self.client.close()

    def _get(self, path: str, missing_ok: bool = False) -> httpx.Response:
        """The answer, raising on a transport error or any status but 200 (and 404 where
        ``missing_ok``)."""
        resp = self.client.get(path)
        if resp.status_code != 200 and not (missing_ok and resp.status_code == 404):
            body = resp.text.replace("\n", " ")[:QUOTE_CHARS]
            raise httpx.HTTPStatusError(
                f"HTTP {resp.status_code} {body}".strip(), request=resp.request, response=resp
            )
        return resp

    def fetch(self) -> Fetched:
        out = Fetched()
        try:  # first: the rates are timed from the start of the tick
            out.metrics = self._get("/metrics").text
        except Exception as exc:  # noqa: BLE001 - any failure is shown, the loop goes on
            out.errors.append(f"GET /metrics: {_why(exc)}")
        try:
            answer = self._get("/v1/models").json()
            out.models = list(answer["data"])
            out.programs = list(answer.get("programs") or [])
        except Exception as exc:  # noqa: BLE001
            out.errors.append(f"GET /v1/models: {_why(exc)}")
        try:
            resp = self._get("/v1/audit", missing_ok=True)
            if resp.status_code == 404:
                out.audit_note = "unavailable (this gateway has no /v1/audit)"
            else:
                out.audit = dict(resp.json())
        except Exception as exc:  # noqa: BLE001
            out.audit_note = f"unavailable ({_why(exc)})"
        return out


class Poller:
    """Turns each fetch into a ``View``, keeping the last good scrape for the next rates
    (a tick whose ``/metrics`` failed leaves it: the next rate spans the gap)."""

    def __init__(
        self,
        fetcher: Fetcher,
        url: str,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.fetcher, self.url, self.interval = fetcher, url, interval
        self.clock, self.wall = clock, wall
        self.previous: Scrape | None = None

    def tick(self, clock_text: str | None = None) -> View:
        at = self.clock()
        fetched = self.fetcher.fetch()
        errors = list(fetched.errors)
        scrape = None
        if fetched.metrics is not None:
            try:
                scrape = parse_scrape(fetched.metrics, at)
            except ValueError as exc:
                errors.append(f"GET /metrics: not Prometheus text ({_why(exc)})")
        between = rates(self.previous, scrape) if self.previous and scrape else None
        if scrape is not None:
            self.previous = scrape
        return View(
            url=self.url,
            interval=self.interval,
            now=self.wall(),
            models=fetched.models,
            programs=fetched.programs,
            scrape=scrape,
            rates=between,
            audit=fetched.audit,
            audit_note=fetched.audit_note,
            errors=errors,
            clock=clock_text,
        )


def once(poller: Poller, sleep: Callable[[float], None] = time.sleep) -> View:
    """Two scrapes ``interval`` apart, so the frame has rates: the second tick's view."""
    poller.tick()
    sleep(poller.interval)
    return poller.tick()


def watch(poller: Poller, console: Console, sleep: Callable[[float], None] = time.sleep) -> None:
    """Redraw every ``interval`` until Ctrl-C (``KeyboardInterrupt``, left to the caller).
    Drawn in place, not on the alternate screen: the last frame stays on the console after
    Ctrl-C; a frame taller than the terminal is cut at its bottom."""
    with Live(console=console, auto_refresh=False) as live:
        while True:
            view = poller.tick(clock_text=time.strftime("%H:%M:%S"))
            live.update(render(view), refresh=True)
            sleep(poller.interval)


def top(
    url: str = URL,
    api_key: str | None = API_KEY,
    interval: float = typer.Option(2.0, min=0.1, help="Seconds between scrapes."),
    once_: bool = typer.Option(
        False, "--once", help="Print one frame as plain text (two scrapes) and exit."
    ),
) -> None:
    """A live view: each model's state, classes and slots (in flight, queued), req/s,
    errors/s and cache hits per model, the ledger's buffer, the audit. Ctrl-C leaves;
    with --once, exits 1 when /v1/models did not answer."""
    poller = Poller(Fetcher(url, api_key, timeout_s=max(5.0, interval)), url, interval)
    try:
        if once_:
            view = once(poller)
            width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
            typer.echo(to_text(render(view), width), nl=False)
            if view.models is None:
                raise typer.Exit(1)
            return
        watch(poller, Console())
    except KeyboardInterrupt:
        pass
    finally:
        poller.fetcher.close()
