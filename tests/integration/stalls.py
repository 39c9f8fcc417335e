"""Shared by the deadline tests of two gateways (the session's ``failover: wait`` one and
``serve run``'s ``next_slot`` one): stall a slot's engine with SIGSTOP and check that
requests bound for it end at their deadline, and that nothing of them is left after."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from gateway.harness.processes import engine_launcher_pid, engine_port, engine_secret_headers
from gateway.harness.running import metric_total

#: What a request may take past its deadline here: the gateway's own guard margin is
#: 0.25 s; the rest is a shared 2-core host answering a burst of 504s.
MARGIN_S = 1.0
TIMEOUT_S = 2.0


@functools.cache
def _secret(port: int) -> dict[str, str]:
    return engine_secret_headers(port)  # a scan of /proc: once per engine, not per poll


def engine_metric(port: int, name: str) -> float:
    """The sum of one vLLM metric on the engine at ``port`` (reached with its secret)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30, headers=_secret(port)).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


def eventually(check: Callable[[], bool], within_s: float) -> bool:
    """Whether ``check()`` holds at some poll within ``within_s``."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def stopped(port: int) -> Iterator[None]:
    """The engine on ``port`` (its whole process group) stopped by SIGSTOP, always
    continued after: well within Serve's 30 s health-check timeout, so Serve does not
    restart it."""
    group = engine_launcher_pid(port)
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


def texts_on_slot(url: str, slot: int, n: int, tag: str, headers: dict[str, str]) -> list[str]:
    """``n`` DisRM inputs whose own slot is ``slot`` (read from ``x-rmgate-slot`` of a
    pinned gateway while every slot answers)."""
    found: list[str] = []
    i = 0
    with httpx.Client(timeout=120, headers=headers) as client:
        while len(found) < n:
            text = f"{tag} {i}: 2+{i % 7}={i % 11}"
            i += 1
            r = client.post(url + "/classify", json={"model": "rm", "input": text})
            assert r.status_code == 200, r.text
            if r.headers["x-rmgate-slot"] == str(slot):
                found.append(text)
    return found


async def _timed(client: httpx.AsyncClient, url: str, body: dict) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = await client.post(
        url + "/classify", json=body, headers={"x-rmgate-timeout": str(TIMEOUT_S)}
    )
    return r, time.monotonic() - start


def check_stalled_slot(
    url: str, engines: Path, slot: int, tag: str, headers: dict[str, str] | None = None
) -> None:
    """Stall ``rm-<slot>``'s engine; six requests of its keys at once and a list of 16
    with one of them, each with ``x-rmgate-timeout: 2``: every one answers 504
    ``deadline_exceeded`` within 2 s + ``MARGIN_S`` (under a per-attempt timeout the
    ones queued behind the stalled ones took a multiple of it). One second after the
    engine continues, nothing of them is left: not in the engine, not at the gate."""
    headers = headers or {}
    mine = texts_on_slot(url, slot, 7, tag, headers)
    others = [f"{tag} sibling {i}" for i in range(15)]
    port = engine_port(engines, f"rm-{slot}")
    aborted = metric_total(url, "rmgate_engine_requests_aborted_total")

    async def burst() -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            singles = [_timed(client, url, {"model": "rm", "input": t}) for t in mine[:6]]
            listed = _timed(client, url, {"model": "rm", "input": others + [mine[6]]})
            return list(await asyncio.gather(*singles, listed))

    with stopped(port):
        answers = asyncio.run(burst())
    for r, took in answers:
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded", r.text
        assert took < TIMEOUT_S + MARGIN_S, (took, r.text)
    assert eventually(
        lambda: (
            engine_metric(port, "vllm:num_requests_running")
            + engine_metric(port, "vllm:num_requests_waiting")
            == 0
        ),
        within_s=1.0,
    )
    # (a canary probe, every 10 minutes, could hold a place for an instant: polled)
    assert eventually(
        lambda: (
            metric_total(url, "rmgate_slot_inflight") + metric_total(url, "rmgate_slot_queued") == 0
        ),
        within_s=3.0,
    )
    assert metric_total(url, "rmgate_engine_requests_aborted_total") > aborted
    r = httpx.post(
        url + "/classify", json={"model": "rm", "input": mine[0]}, headers=headers, timeout=120
    )
    assert r.status_code == 200 and r.headers["x-rmgate-slot"] == str(slot), r.text


def long_judge_request_then_leave(url: str, seed: int, timeout_s: float, hold_s: float) -> None:
    """A judge request for 8 x 1,000 tokens sent over a raw socket to ``url``, whose client
    closes the socket after ``hold_s`` seconds (a trainer that went away)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": "judge",
            "max_tokens": 1000,
            "ignore_eos": True,
            "n": 8,
            "seed": seed,
            "messages": [{"role": "user", "content": "a long answer, please"}],
        }
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}"
            f"\r\nx-rmgate-timeout: {timeout_s:g}\r\n\r\n{body}".encode()
        )
        time.sleep(hold_s)


def until_quiet(read: Callable[[], float], polls: int) -> float:
    """``read()`` (the engines' token count) once it holds still for a second."""
    stopped = None
    for _ in range(polls):
        time.sleep(1.0)
        now = read()
        if now == stopped:
            return now
        stopped = now
    raise AssertionError("the engines never went quiet")
