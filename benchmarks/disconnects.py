"""Does a client that leaves stop the engine's work? Counted hop by hop, with the engine
reached directly as the anchor, in one run.

Starts ``rmgate serve benchmarks/configs/disconnects.yaml`` (two slots of the demo judge,
nothing cached). Each attempt sends a judge request for 8 x 1,000 tokens (``n: 8``,
``ignore_eos``; about 20 s of generation on 2 cores) with ``x-rmgate-timeout: 6`` over a
raw socket, and closes the socket after ``--hold`` seconds. Then it waits until the
engines stop generating and records, per attempt:

* whether HAProxy saw the client's close (its ``cli_abrt`` counter, from its admin socket);
* whether the gateway did (the request ends as 499 in ``rmgate_requests_total``, and
  ``rmgate_client_disconnects_total`` counts it) or only its deadline ended it (504);
* how many tokens the engines generated for it (fewer than 4,000: stopped early);

and, interleaved with these, the same request and close sent straight to a judge engine
(with its secret): how often vLLM's own server notices a close (the anchor).

    .venv/bin/python -m benchmarks.disconnects [--attempts 30] [--hold 0.3]
        [--out benchmarks/results/disconnects.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.side_by_side import engine_urls
from deployments.engine.process import free_port
from gateway.harness.processes import engine_secret_headers, stop_process_group
from gateway.harness.running import wait_until_serving

REPO = Path(__file__).resolve().parents[1]
#: tokens an attempt may generate and still count as stopped early (8,000 when not)
EARLY = 4000


def metric_lines(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30, headers=headers).text
    return {
        k: float(v)
        for k, v in (
            line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
        )
    }


def total(lines: dict[str, float], name: str, needle: str = "") -> float:
    return sum(v for k, v in lines.items() if k.startswith(name + "{") and needle in k)


def haproxy_client_aborts(workdir: Path) -> float | None:
    """HAProxy's ``cli_abrt`` summed over its backends (None without its admin socket)."""
    socks = sorted(workdir.glob("*/admin.sock"), key=os.path.getmtime)
    if not socks:
        return None
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(socks[-1]))
        conn.sendall(b"show stat\n")
        data = b"".join(iter(lambda: conn.recv(65536), b""))
    lines = data.decode().splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
    return float(sum(int(r.get("cli_abrt") or 0) for r in rows if r.get("svname") == "BACKEND"))


def send_and_leave(base: str, body: bytes, hold_s: float, headers: dict[str, str]) -> None:
    host, port = base.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
            + body
        )
        time.sleep(hold_s)


def generated(engines: list[str], secrets: dict[str, dict[str, str]]) -> float:
    return sum(total(metric_lines(e, secrets[e]), "vllm:generation_tokens_total") for e in engines)


def until_quiet(engines: list[str], secrets: dict[str, dict[str, str]]) -> float:
    """The engines' token count once it holds still for a second."""
    last = None
    for _ in range(60):
        time.sleep(1.0)
        now = generated(engines, secrets)
        if now == last:
            return now
        last = now
    raise RuntimeError("the engines never went quiet")


def attempt(
    target: str,
    url: str,
    engines: list[str],
    secrets: dict[str, dict[str, str]],
    proxy_dir: Path,
    seed: int,
    hold_s: float,
) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": "judge",
            "max_tokens": 1000,
            "ignore_eos": True,
            "n": 8,
            "seed": seed,
            "messages": [{"role": "user", "content": "a long answer"}],
        }
    ).encode()
    before_tokens = generated(engines, secrets)
    before = metric_lines(url)
    aborts = haproxy_client_aborts(proxy_dir)
    if target == "engine":
        send_and_leave(engines[0], body, hold_s, secrets[engines[0]])
    else:
        send_and_leave(url, body, hold_s, {"x-rmgate-timeout": "6"})
    tokens = until_quiet(engines, secrets) - before_tokens
    after = metric_lines(url)
    row: dict[str, Any] = {"target": target, "tokens": tokens, "stopped_early": tokens < EARLY}
    if target == "rmgate":
        row["gateway_noticed"] = (
            total(after, "rmgate_requests_total", 'status="499"')
            - total(before, "rmgate_requests_total", 'status="499"')
            >= 1
        )
        row["deadline_ended"] = (
            total(after, "rmgate_requests_total", 'status="504"')
            - total(before, "rmgate_requests_total", 'status="504"')
            >= 1
        )
        now = haproxy_client_aborts(proxy_dir)
        row["haproxy_noticed"] = None if aborts is None or now is None else now - aborts >= 1
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def share(target: str, key: str) -> str:
        xs = [r[key] for r in rows if r["target"] == target and r.get(key) is not None]
        return f"{sum(xs)}/{len(xs)}"

    return {
        "engine_directly_stopped_early": share("engine", "stopped_early"),
        "haproxy_noticed": share("rmgate", "haproxy_noticed"),
        "gateway_noticed": share("rmgate", "gateway_noticed"),
        "deadline_ended": share("rmgate", "deadline_ended"),
        "through_rmgate_stopped_early": share("rmgate", "stopped_early"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", type=int, default=30, help="attempts per target")
    ap.add_argument("--hold", type=float, default=0.3, help="seconds before the client leaves")
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "disconnects.json"
    )
    args = ap.parse_args()

    from deployments.demo.models import build_demo_models, demo_models_present

    if not demo_models_present(REPO / "models" / "demo"):
        build_demo_models(REPO / "models" / "demo")
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="rmgate-disconnects-"))
    env = {
        **os.environ,
        "RMGATE_LOG_DIR": str(logs / "engines"),
        "HF_HUB_OFFLINE": "1",
        "RMGATE_STATE_DIR": str(logs / "state"),
    }
    with open(logs / "serve.log", "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                str(REPO / "benchmarks/configs/disconnects.yaml"),
                "--port",
                str(port),
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        wait_until_serving(url, proc, logs / "serve.log", 900)
        engines = engine_urls(logs / "engines", "judge", 2)
        secrets = {e: engine_secret_headers(e.rsplit(":", 1)[1]) for e in engines}
        proxy_dir = Path(tempfile.gettempdir()) / f"rmgate-proxy-{proc.pid}"  # gateway/cli.py
        for i in range(args.attempts):
            for target in ("rmgate", "engine"):
                rows.append(
                    attempt(
                        target,
                        url,
                        engines,
                        secrets,
                        proxy_dir,
                        1000 + 2 * i + (target == "engine"),
                        args.hold,
                    )
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        stop_process_group(proc)
    result = {
        "attempts": args.attempts,
        "hold_s": args.hold,
        "summary": summary(rows),
        "rows": rows,
    }
    for key, value in result["summary"].items():
        print(f"{key:<32}{value:>8}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
