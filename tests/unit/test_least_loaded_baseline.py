"""The least-loaded baseline proxy says why a backend failed instead of answering a bare 500
(a bare 500 from it once failed the side-by-side benchmark in CI with nothing to go on)."""

from __future__ import annotations

import socket

import httpx

from gateway.harness.least_loaded import create_app


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_backend_transport_error_is_a_502_naming_the_backend():
    backend = f"http://127.0.0.1:{_closed_port()}"
    app = create_app([backend])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        r = await c.post("/classify", json={"model": "rm", "input": ["x"]})
    assert r.status_code == 502
    assert backend in r.json()["error"] and "ConnectError" in r.json()["error"]
