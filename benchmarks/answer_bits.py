"""The exact answers a real gateway gives for a fixed set of requests, recorded so that a
refactor can be checked byte for byte: record before, record after, compare.

Why: a refactor (modules moved, imports rewired) must not change one bit of any answer.
The unit and integration tests check properties of answers (in range, equal across
replays, equal to a hand computation); this records the answers themselves, from a real
``rmgate serve`` (Ray Serve + vLLM CPU engines), so two trees can be compared directly.

``record`` starts ``rmgate serve CONFIG`` with the project's harness
(``gateway.harness.running``; it runs the CLI with its own checkout as the working
directory, so running this file under another tree's ``PYTHONPATH`` records that tree),
on a fresh state directory, with a throwaway PostgreSQL server (the harness's) when the
config's ledger is PostgreSQL and no DSN is set (``configs/test-cpu.yaml``'s is). It sends a
fixed, deterministic request set built from the config's models and reward programs, every
request with ``x-rmgate-cache: off`` (an engine answers, never the ledger): once in order,
then again shuffled, 16 at once; it writes both passes and says whether they agree (the
concurrent pass must not change bits). The gateway is stopped on every exit.

``compare A B`` prints, per request, whether status and body are the same, and exits 1 if
any differ. The body is compared as the exact text, except the top-level ``id`` and
``created`` of a vLLM response (a random id and a clock: ``gateway.core.api.answers``
never compares them either); an ``id`` the gateway derives from the request key
(``...-rmgate-<key>``) is compared. Header differences (``x-rmgate-key`` and the others
kept) are printed as notes.

    python benchmarks/answer_bits.py record --out FILE [--config configs/test-cpu.yaml]
    python benchmarks/answer_bits.py compare A.json B.json

Recording the tree before a refactor from a worktree of its commit:

    git worktree add /work/before d32363b       # then models/demo there (copied or built)
    cd /work/before && PYTHONPATH=/work/before /work/main/.venv/bin/python \\
        /work/main/benchmarks/answer_bits.py record --out before.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import yaml

FORMAT = "rmgate-answer-bits/1"
#: Sent with every request: the answer comes from an engine, not from the ledger.
CACHE_OFF = {"x-rmgate-cache": "off"}
#: Response headers kept: functions of the request, the config and the engines' build, not
#: of timing (``x-rmgate-cache``, ``-failover`` and ``-placement`` are left out).
KEPT_HEADERS = (
    "x-rmgate-model",
    "x-rmgate-key",
    "x-rmgate-seed",
    "x-rmgate-slot",
    "x-rmgate-class",
    "x-rmgate-fingerprint",
    "x-rmgate-receipt",
    "x-rmgate-max-tokens-clamped",
)
#: Top-level fields of a response that differ between two identical runs (``id``,
#: ``created``) or between two checkouts of the same code (vLLM's ``system_fingerprint``
#: hashes its config, the model folder's path included); never the answer itself.
VOLATILE = ("id", "created", "system_fingerprint")
CONCURRENCY = 16
SHUFFLE_SEED = 20261205
REQUEST_TIMEOUT_S = 600.0
#: A response that makes the programs' ``^(a+)+$`` rule backtrack without end (cut off at
#: its timeout), as in tests/integration/test_reward_programs.py.
HANG = "a" * 40 + "b"


# ---- the request set ------------------------------------------------------------------


def load_app_args(config: Path) -> dict[str, Any]:
    """``args`` of the config's rmgate application (the one that lists ``models``)."""
    doc = yaml.safe_load(config.read_text())
    for app in doc.get("applications", []):
        args = app.get("args") or {}
        if "models" in args:
            return args
    raise SystemExit(f"{config}: no application with `models`")


def _sum_items() -> list[dict[str, Any]]:
    """Single-digit sums, right and wrong, prompt or messages, labels of several types."""
    return [
        {"prompt": "2+3=", "response": "5", "label": "5"},
        {"prompt": "4+4=", "response": "9", "label": 8},
        {"messages": [{"role": "user", "content": "7+1="}], "response": "8", "label": 8.0},
        {
            "messages": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": "6+3="},
            ],
            "response": "7",
            "label": "9",
        },
    ]


def _any_label_items() -> list[dict[str, Any]]:
    """Items whose labels are every JSON type (models that do not read the label)."""
    return [
        {"prompt": "1+1=", "response": "2", "label": True},
        {"prompt": "3+5=", "response": "7", "label": None},
        {"prompt": "9+0=", "response": "9", "label": [9, "nine"]},
        {
            "messages": [{"role": "user", "content": "5+4="}],
            "response": "9",
            "label": {"answer": 9, "why": "5+4"},
        },
        {"messages": [{"role": "user", "content": "ü+ß=?"}], "response": "ø", "label": 1.5},
        {"prompt": "8+8=", "response": "sixteen", "label": -3},
    ]


def build_requests(args: dict[str, Any]) -> list[dict[str, Any]]:
    """The fixed request set (``{"path", "request"}``), in order, for the config's models
    and programs: the same config gives the same list."""
    models = args["models"]
    programs = args.get("programs") or []
    generative = [m["name"] for m in models if m.get("kind") == "generative"]
    discriminative = [m["name"] for m in models if m.get("kind") == "discriminative"]
    out: list[dict[str, Any]] = []

    def add(path: str, body: dict[str, Any]) -> None:
        out.append({"path": path, "request": body})

    sums, anys = _sum_items(), _any_label_items()
    # /v1/rewards naming each model
    for name in discriminative + generative:
        add("/v1/rewards", {"model": name, "items": sums})
        add("/v1/rewards", {"model": name, "items": anys[:3] if name in generative else anys})
    add("/v1/rewards", {"items": [sums[0], anys[3]]})  # the default reward model
    # /v1/rewards naming each program: plain items, then with the hanging response
    for program in programs:
        add("/v1/rewards", {"model": program["name"], "items": sums})
        add(
            "/v1/rewards",
            {
                "model": program["name"],
                "items": [sums[0], {"prompt": "say a", "response": HANG, "label": "a"}],
            },
        )
    # /get_reward (OpenRLHF): the default reward model
    add("/get_reward", {"query": ["2+3=5", "4+4=9"]})
    add(
        "/get_reward",
        {
            "query": ["2+3=5", "4+4=9", "7+1=8"],
            "prompts": ["2+3=", "4+4=", "7+1="],
            "labels": ["5", "8", "8"],
        },
    )
    add(
        "/get_reward",
        {
            "query": ["1+1=2", "3+5=7", "9+0=9", "5+4=9"],
            "prompts": ["1+1=", "3+5=", "9+0=", "5+4="],
            "labels": [2, None, [9], {"a": True}],
        },
    )
    for name in discriminative:
        add("/classify", {"model": name, "input": "2+3=5"})
        add("/classify", {"model": name, "input": ["2+3=5", "2+3=6", "0+0=0", "9+9=18"]})
        add(
            "/classify",
            {
                "model": name,
                "messages": [
                    {"role": "user", "content": "2+3="},
                    {"role": "assistant", "content": "5"},
                ],
            },
        )
        add("/v1/embeddings", {"model": name, "input": "4+4=8"})
    if discriminative:
        first = discriminative[0]
        add("/v1/embeddings", {"model": first, "input": ["4+4=8", "4+4=9"]})
        add("/v1/embeddings", {"model": first, "input": "4+4=8", "encoding_format": "base64"})
        add("/pooling", {"model": first, "input": ["1+2=3", "1+2=4"]})
    for name in generative:
        ask = [{"role": "user", "content": "Is 2+3=5 right?"}]
        add("/v1/chat/completions", {"model": name, "messages": ask})
        add("/v1/chat/completions", {"model": name, "messages": ask, "max_tokens": 4})
        add("/v1/chat/completions", {"model": name, "messages": ask, "max_tokens": 8})
        add("/v1/chat/completions", {"model": name, "messages": ask, "max_tokens": 8, "seed": 7})
        add(
            "/v1/chat/completions",
            {"model": name, "messages": ask, "max_tokens": 16, "seed": 12345},
        )
        add(
            "/v1/chat/completions",
            {
                "model": name,
                "max_tokens": 6,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Is 4+4=9 right?"}],
                "logprobs": True,
                "top_logprobs": 3,
            },
        )
        add(
            "/v1/chat/completions",
            {
                "model": name,
                "max_tokens": 12,
                "seed": 3,
                "messages": [
                    {"role": "system", "content": "Judge sums."},
                    {"role": "user", "content": "Is 7+1=8 right?"},
                    {"role": "assistant", "content": "Score: 1"},
                    {"role": "user", "content": "Is 6+3=7 right?"},
                ],
            },
        )
        add("/v1/completions", {"model": name, "prompt": "Is 2+3=5 right?", "max_tokens": 8})
        add(
            "/v1/completions",
            {"model": name, "prompt": "Is 2+3=5 right?", "max_tokens": 8, "seed": 7},
        )
        add(
            "/v1/completions",
            {
                "model": name,
                "prompt": ["Is 1+1=2 right?", "Is 1+1=3 right?"],
                "max_tokens": 4,
                "seed": 11,
            },
        )
    if len(generative) == 1:  # the only generative model answers a request naming none
        add(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Is 9+9=18 right?"}], "max_tokens": 5},
        )
    return out


# ---- answers --------------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def top_level_spans(text: str) -> dict[str, tuple[int, int]] | None:
    """Where each top-level member's value lies in ``text`` (a JSON object), as written;
    None when ``text`` is not one."""
    try:
        i = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[i] != "{":
            return None
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        spans: dict[str, tuple[int, int]] = {}
        if text[i] == "}":
            return spans
        while True:
            key, i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if not isinstance(key, str) or text[i] != ":":
                return None
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            _, end = _DECODER.raw_decode(text, i)
            spans[key] = (i, end)
            i = _WS.match(text, end).end()  # type: ignore[union-attr]
            if text[i] == "}":
                return spans
            if text[i] != ",":
                return None
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
    except (ValueError, IndexError):
        return None


def compared_body(body: str) -> str:
    """``body`` as compared: the exact text with the values of its volatile top-level
    fields (a random ``id``, ``created``) replaced by ``"<volatile>"``."""
    spans = top_level_spans(body)
    if not spans:
        return body
    cut = []
    for name in VOLATILE:
        if name in spans:
            start, end = spans[name]
            if name == "id" and "-rmgate-" in body[start:end]:
                continue  # derived from the request key: part of the answer
            cut.append((start, end))
    for start, end in sorted(cut, reverse=True):
        body = body[:start] + '"<volatile>"' + body[end:]
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def answer(response: httpx.Response) -> dict[str, Any]:
    raw = response.content
    try:
        text, encoding = raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = raw.decode("latin-1"), "latin-1"
    out: dict[str, Any] = {
        "status": response.status_code,
        "body": text,
        "body_sha256": hashlib.sha256(raw).hexdigest(),
        "headers": {h: response.headers[h] for h in KEPT_HEADERS if h in response.headers},
    }
    if encoding != "utf-8":
        out["body_encoding"] = encoding
    return out


def sequential_pass(url: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    with httpx.Client(
        base_url=url,
        timeout=REQUEST_TIMEOUT_S,
        headers={**CACHE_OFF, "content-type": "application/json"},
    ) as client:
        for i, req in enumerate(requests):
            r = client.post(req["path"], content=encode(req["request"]))
            out.append(answer(r))
            print(f"  [{i:2d}] {r.status_code} {req['path']}", flush=True)
    return out


async def concurrent_pass(
    url: str, requests: list[dict[str, Any]], order: list[int]
) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(CONCURRENCY)
    out: dict[int, dict[str, Any]] = {}
    async with httpx.AsyncClient(
        base_url=url,
        timeout=REQUEST_TIMEOUT_S,
        headers={**CACHE_OFF, "content-type": "application/json"},
        limits=httpx.Limits(max_connections=CONCURRENCY + 4),
    ) as client:

        async def one(i: int) -> None:
            async with sem:
                r = await client.post(requests[i]["path"], content=encode(requests[i]["request"]))
            out[i] = answer(r)

        await asyncio.gather(*(one(i) for i in order))
    return [out[i] for i in range(len(requests))]


def differences(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what differs in status and body, what differs in the kept headers)."""
    diff = []
    if a["status"] != b["status"]:
        diff.append(f"status {a['status']} != {b['status']}")
    if compared_body(a["body"]) != compared_body(b["body"]):
        diff.append("body")
    notes = [
        f"{h}: {a['headers'].get(h)} != {b['headers'].get(h)}"
        for h in KEPT_HEADERS
        if a["headers"].get(h) != b["headers"].get(h)
    ]
    return diff, notes


# ---- record ---------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else f"(git failed: {done.stderr.strip()})"


def ensure_models(args: dict[str, Any], repo: Path, env: dict[str, str]) -> None:
    """The config's model folders (relative ones are the checkout's), the demo models
    built when missing (``python -m gateway.cli make-demo-models``)."""
    paths = [Path(m["model_path"]) for m in args["models"]]
    paths = [p if p.is_absolute() else repo / p for p in paths]
    missing = [p for p in paths if not (p / "config.json").exists()]
    if not missing:
        return
    folders = {p.parent for p in missing}
    if len(folders) != 1 or next(iter(folders)).name != "demo":
        raise SystemExit(f"model folders missing and not the demo models: {missing}")
    out = next(iter(folders))
    print(f"building the demo models in {out}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "gateway.cli", "make-demo-models", str(out)],
        cwd=repo,
        env=env,
        check=True,
    )


def gateway_processes(marker: str) -> dict[str, Any]:
    """Working directory and PYTHONPATH of every process the gateway started (they carry
    ``marker`` in their environment): which tree's code they load."""
    from gateway.harness.processes import processes_with_env

    cwds: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for pid in processes_with_env(marker):
        try:
            cwds[os.readlink(f"/proc/{pid}/cwd")] += 1
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"PYTHONPATH=")]
        paths[found[0] if found else "(unset)"] += 1
    return {"cwd": dict(cwds), "PYTHONPATH": dict(paths)}


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def record(config: Path, out_path: Path) -> int:
    import gateway
    from gateway.harness.running import REPO, running_gateway

    _stop_on_sigterm()
    config = config.resolve()
    args = load_app_args(config)
    requests = build_requests(args)
    order = list(range(len(requests)))
    random.Random(SHUFFLE_SEED).shuffle(order)
    print(
        f"tree {REPO} (gateway from {Path(gateway.__file__).parent}); config {config}; "
        f"{len(requests)} requests",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="rmgate-answer-bits-"))
    env = {
        "RMGATE_STATE_DIR": str(workdir / "state"),
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    ensure_models(args, REPO, {**os.environ, **env})
    meta: dict[str, Any] = {
        "format": FORMAT,
        "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tree": str(REPO),
        "gateway_package": str(Path(gateway.__file__).parent),
        "git_head": _git(REPO, "rev-parse", "HEAD"),
        "git_changed_files": len(_git(REPO, "status", "--porcelain").splitlines()),
        "config": str(config),
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "python": sys.version.split()[0],
        "concurrency": CONCURRENCY,
        "shuffle_seed": SHUFFLE_SEED,
        "volatile_fields": list(VOLATILE),
    }
    t0 = time.monotonic()
    with ExitStack() as stack:
        ledger = (args.get("gateway") or {}).get("ledger") or {}
        dsn_env = ledger.get("dsn_env", "RMGATE_LEDGER_DSN")
        if (
            ledger.get("backend") == "postgres"
            and not ledger.get("dsn")
            and not os.environ.get(dsn_env)
        ):
            from gateway.harness.postgres import ThrowawayPostgres

            postgres = ThrowawayPostgres()
            stack.callback(postgres.destroy)
            postgres.start()
            env[dsn_env] = postgres.dsn
            meta["ledger"] = "throwaway postgres (gateway.harness.postgres)"
        else:
            meta["ledger"] = ledger.get("backend", "sqlite")
        print(f"starting rmgate serve (log: {workdir / 'serve.log'})", flush=True)
        url, engines = stack.enter_context(running_gateway(config, workdir, env=env))
        meta["boot_s"] = round(time.monotonic() - t0, 1)
        meta["processes"] = gateway_processes(str(engines))
        print(
            f"serving at {url} after {meta['boot_s']} s; its processes: {meta['processes']}",
            flush=True,
        )
        t1 = time.monotonic()
        print("sequential pass", flush=True)
        sequential = sequential_pass(url, requests)
        t2 = time.monotonic()
        print(f"concurrent pass ({CONCURRENCY} at once, shuffled)", flush=True)
        concurrent = asyncio.run(concurrent_pass(url, requests, order))
        t3 = time.monotonic()
        meta.update(sequential_s=round(t2 - t1, 1), concurrent_s=round(t3 - t2, 1))
        print("stopping the gateway", flush=True)
    meta["total_s"] = round(time.monotonic() - t0, 1)
    answers = [
        {"index": i, "path": req["path"], "request": req["request"], **seq, "concurrent": con}
        for i, (req, seq, con) in enumerate(zip(requests, sequential, concurrent))
    ]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps({"meta": meta, "answers": answers}, indent=1, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    print(
        f"wrote {out_path} ({meta['total_s']} s: boot {meta['boot_s']}, sequential "
        f"{meta['sequential_s']}, concurrent {meta['concurrent_s']})"
    )
    statuses = Counter((a["path"], a["status"]) for a in answers)
    for (path, status), n in sorted(statuses.items()):
        print(f"  {path:22s} {status}: {n}")
    bad = 0
    for a in answers:
        diff, notes = differences(a, a["concurrent"])
        if diff or notes:
            print(f"  [{a['index']:2d}] {a['path']}: concurrent pass differs: {diff + notes}")
        bad += bool(diff)
    print(f"sequential vs concurrent: {len(answers) - bad} same, {bad} different")
    return 1 if bad else 0


# ---- compare --------------------------------------------------------------------------


def compare(a_path: Path, b_path: Path) -> int:
    a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (a_path, b_path))
    rows_a, rows_b = a["answers"], b["answers"]
    differ = 0
    if len(rows_a) != len(rows_b):
        print(f"{len(rows_a)} vs {len(rows_b)} requests")
        differ += 1
    for x, y in zip(rows_a, rows_b):
        where = f"[{x['index']:2d}] {x['path']}"
        if (x["path"], x["request"]) != (y["path"], y["request"]):
            print(f"{where}: different (another request: the sets do not match)")
            differ += 1
            continue
        diff, notes = differences(x, y)
        raw = "" if x["body"] != y["body"] else ", byte-identical"
        print(
            f"{where}: {'DIFFERENT (' + ', '.join(diff) + ')' if diff else 'same' + raw}"
            + (f"; headers: {notes}" if notes else "")
        )
        differ += bool(diff)
    print(
        f"{len(rows_a) - differ} same, {differ} different "
        f"({a['meta'].get('tree')}@{a['meta'].get('git_head', '')[:9]} vs "
        f"{b['meta'].get('tree')}@{b['meta'].get('git_head', '')[:9]})"
    )
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="start rmgate serve, record its answers, stop it")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument(
        "--config",
        type=Path,
        default=Path("configs/test-cpu.yaml"),
        help="relative to the working directory (default: configs/test-cpu.yaml)",
    )
    cmp_ = sub.add_parser("compare", help="status and body of two records, per request")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    ns = parser.parse_args(argv)
    if ns.command == "record":
        return record(ns.config, ns.out)
    return compare(ns.a, ns.b)


if __name__ == "__main__":
    sys.exit(main())
