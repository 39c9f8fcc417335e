"""Request sets and replay helpers for the determinism tests."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import httpx

WORDS = ("the cat sat on a mat and 2+3=5 is right while 4+4=9 is wrong answer judge "
         "score reward yes no 7 12 ü ✓").split()


@dataclass(frozen=True)
class Call:
    path: str
    body: dict[str, Any]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def grm_calls(n: int, model: str = "judge", seed: int = 0) -> list[Call]:
    """Chat and completion requests at temperature 1.0 with logprobs; half carry a seed."""
    rng = random.Random(seed)
    calls = []
    for i in range(n):
        body: dict[str, Any] = {"model": model, "temperature": 1.0, "max_tokens": 12}
        if i % 2 == 0:
            body["seed"] = rng.randint(0, 2**31 - 1)
        if i % 4 == 3:
            body.update(prompt=_text(rng, 1, 30), logprobs=2)
            calls.append(Call("/v1/completions", body))
        else:
            body.update(messages=[{"role": "user", "content": _text(rng, 1, 30)}],
                        logprobs=True, top_logprobs=2)
            calls.append(Call("/v1/chat/completions", body))
    return calls


def disrm_calls(n: int, model: str = "rm", seed: int = 1) -> list[Call]:
    """Single and list inputs over /classify and /pooling, with activation synonyms."""
    rng = random.Random(seed)
    calls = []
    for i in range(n):
        body: dict[str, Any] = {"model": model}
        if i % 5 == 4:
            body["input"] = [_text(rng, 0, 12) or "x" for _ in range(rng.randint(2, 5))]
        else:
            body["input"] = _text(rng, 1, 40)
        flag = ("use_activation", "activation", "softmax")[i % 3]
        body[flag] = bool(i % 2)
        calls.append(Call("/pooling" if i % 7 == 6 else "/classify", body))
    return calls


def essence(path: str, data: dict[str, Any]) -> Any:
    """What must be bitwise equal across runs: texts, logprobs, scores (not ids or times)."""
    if path in ("/classify", "/pooling"):
        return [(d["index"], d.get("probs", d.get("data"))) for d in data["data"]]
    out = []
    for ch in data["choices"]:
        text = ch["message"]["content"] if "message" in ch else ch["text"]
        out.append((ch["index"], text, ch.get("logprobs"), ch.get("finish_reason")))
    return out


@dataclass
class Result:
    status: int
    essence: Any
    slot: str | None
    seed: str | None
    key: str | None


async def replay(url: str, calls: list[Call], order: list[int], concurrency: int,
                 timeout_s: float = 600) -> dict[int, Result]:
    """Send ``calls`` in ``order`` with at most ``concurrency`` in flight; results by index."""
    sem = asyncio.Semaphore(concurrency)
    results: dict[int, Result] = {}
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def one(i: int) -> None:
            async with sem:
                r = await client.post(calls[i].path, json=calls[i].body)
            ess = essence(calls[i].path, r.json()) if r.status_code == 200 else r.text
            results[i] = Result(r.status_code, ess, r.headers.get("x-rmgate-slot"),
                                r.headers.get("x-rmgate-seed"), r.headers.get("x-rmgate-key"))
        await asyncio.gather(*(one(i) for i in order))
    return results


def shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order
