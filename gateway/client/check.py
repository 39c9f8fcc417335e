"""``rmgate check``: replay requests against a live gateway and prove (or refute) that the
answers are bitwise identical across orders, concurrency levels and deployments.

What is compared is what the product promises: the answer's bits (``gateway.core.api.answers``:
scores, text, logprobs), the seed the request was given (``x-rmgate-seed``) and the numerics
class that answered (``x-rmgate-class``, where both sides name one). The slot is not
compared: under ``placement: class`` any slot of the key's class may answer, with the same
bits; the slots used are shown for information.

Imports no Ray and no vLLM: it runs anywhere the client runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.core.api.answers import Answer, answer_of

WORDS = (
    "the cat sat on a mat and 2+3=5 is right while 4+4=9 is wrong answer judge "
    "score reward yes no 7 12 ü ✓"
).split()


@dataclass(frozen=True)
class Call:
    path: str
    body: dict[str, Any]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def grm_calls(n: int, model: str = "judge", seed: int = 0, max_tokens: int = 12) -> list[Call]:
    """Chat and completion requests at temperature 1.0 with logprobs; half carry a seed."""
    rng = random.Random(seed)
    calls = []
    for i in range(n):
        body: dict[str, Any] = {"model": model, "temperature": 1.0, "max_tokens": max_tokens}
        if i % 2 == 0:
            body["seed"] = rng.randint(0, 2**31 - 1)
        if i % 4 == 3:
            body.update(prompt=_text(rng, 1, 30), logprobs=2)
            calls.append(Call("/v1/completions", body))
        else:
            body.update(
                messages=[{"role": "user", "content": _text(rng, 1, 30)}],
                logprobs=True,
                top_logprobs=2,
            )
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
        body[("use_activation", "activation", "softmax")[i % 3]] = bool(i % 2)
        calls.append(Call("/pooling" if i % 7 == 6 else "/classify", body))
    return calls


def load_calls(path: Path) -> list[Call]:
    """A JSON-lines request file: one ``{"path": "/classify", "body": {...}}`` per line."""
    calls = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            obj = json.loads(line)
            if not isinstance(obj, dict) or "path" not in obj or "body" not in obj:
                raise ValueError(f'{path}:{n}: expected {{"path": ..., "body": {{...}}}}')
            calls.append(Call(obj["path"], obj["body"]))
    return calls


#: What must be bitwise equal: the one shared definition (``gateway.core.api.answers``), under
#: the name this module has always used. ``essence(path, body)`` is an ``Answer``.
essence = answer_of


@dataclass
class Result:
    status: int
    essence: Any
    slot: str | None
    seed: str | None
    key: str | None
    numerics_class: str | None = None

    def differs_from(self, ref: Result) -> bool:
        """Other bits, another seed, or another numerics class (when both name one)."""
        if self.essence != ref.essence or self.seed != ref.seed:
            return True
        return bool(
            self.numerics_class and ref.numerics_class and self.numerics_class != ref.numerics_class
        )


async def replay(
    url: str,
    calls: list[Call],
    order: list[int],
    concurrency: int,
    timeout_s: float = 600,
    progress: Any = None,
    headers: dict[str, str] | None = None,
) -> dict[int, Result]:
    """Send ``calls`` in ``order`` with at most ``concurrency`` in flight; results by index.
    Every request asks for an engine's answer (``x-rmgate-cache: off``): a check of bits
    answered from the ledger would prove nothing about the engines."""
    sem = asyncio.Semaphore(concurrency)
    results: dict[int, Result] = {}
    headers = {**(headers or {}), "x-rmgate-cache": "off"}
    async with httpx.AsyncClient(
        base_url=url,
        timeout=timeout_s,
        headers=headers,
        limits=httpx.Limits(max_connections=concurrency + 4),
    ) as client:

        async def one(i: int) -> None:
            async with sem:
                r = await client.post(calls[i].path, json=calls[i].body)
            try:
                ess = essence(calls[i].path, r.json()) if r.status_code == 200 else r.text
            except ValueError:
                ess = r.text
            results[i] = Result(
                r.status_code,
                ess,
                r.headers.get("x-rmgate-slot"),
                r.headers.get("x-rmgate-seed"),
                r.headers.get("x-rmgate-key"),
                r.headers.get("x-rmgate-class"),
            )
            if progress is not None:
                progress.update(1)

        await asyncio.gather(*(one(i) for i in order))
    return results


def shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def _numbers(x: Any) -> list[float]:
    if isinstance(x, Answer):
        return _numbers(x.value)
    if isinstance(x, bool) or x is None:
        return []
    if isinstance(x, (int, float)):
        return [float(x)]
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _numbers(x[k])]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _numbers(item)]
    return []


def max_abs_diff(a: Any, b: Any) -> float:
    na, nb = _numbers(a), _numbers(b)
    if len(na) != len(nb):
        return math.inf
    return max((abs(x - y) for x, y in zip(na, nb)), default=0.0)


@dataclass
class RunVerdict:
    label: str
    requests: int
    identical: int
    differing: int
    failed: int
    max_abs_diff: float
    slots: list[str] = field(default_factory=list)
    #: How many of the differing answers differ only in the numerics class that answered.
    other_class: int = 0
    classes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.differing == 0 and self.failed == 0


def _split(values: Any) -> list[str]:
    return sorted({s for v in values if v for s in v.split(",")})


def compare(label: str, reference: dict[int, Result], run: dict[int, Result]) -> RunVerdict:
    """Count identical, differing and failed answers of ``run`` against ``reference``."""
    identical = differing = failed = other_class = 0
    worst = 0.0
    for i, ref in reference.items():
        got = run[i]
        if got.status != 200 or ref.status != 200:
            failed += 1
        elif not got.differs_from(ref):
            identical += 1
        else:
            differing += 1
            if got.essence == ref.essence and got.seed == ref.seed:
                other_class += 1
            worst = max(worst, max_abs_diff(ref.essence, got.essence))
    return RunVerdict(
        label,
        len(reference),
        identical,
        differing,
        failed,
        worst,
        _split(r.slot for r in run.values()),
        other_class,
        _split(r.numerics_class for r in run.values()),
    )


async def served_models(url: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        r = await client.get(url.rstrip("/") + "/v1/models")
        r.raise_for_status()
        return r.json()["data"]


def generated_calls(models: list[dict[str, Any]], per_model: int) -> list[Call]:
    calls: list[Call] = []
    for m in models:
        if m.get("kind") == "generative":
            calls += grm_calls(per_model, model=m["id"])
        elif m.get("kind") == "discriminative":
            calls += disrm_calls(per_model, model=m["id"])
    return calls


async def check(
    url: str,
    calls: list[Call],
    concurrencies: list[int],
    repeats: int,
    against: str | None = None,
    headers: dict[str, str] | None = None,
    show_progress: bool = True,
) -> list[RunVerdict]:
    """Replay ``calls`` ``repeats`` times per concurrency in shuffled orders; compare all
    runs (and every run on ``against``) with the first run on ``url``."""
    plan = [
        (u, c, r)
        for u in ([url] + ([against] if against else []))
        for c in concurrencies
        for r in range(repeats)
    ]
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan) * len(calls), unit="req", desc="rmgate check")
    verdicts, reference = [], None
    try:
        for n, (u, conc, rep) in enumerate(plan):
            run = await replay(
                u, calls, shuffled(len(calls), 1000 + n), conc, progress=bar, headers=headers
            )
            label = f"{'B' if u == against and against else 'A'} c={conc} #{rep + 1}"
            if reference is None:
                reference = run
                verdicts.append(compare(label + " (reference)", reference, run))
            else:
                verdicts.append(compare(label, reference, run))
    finally:
        if bar is not None:
            bar.close()
    return verdicts


def format_table(verdicts: list[RunVerdict]) -> str:
    """The verdict table; ``slots used`` and ``classes`` are information, not differences."""
    head = (
        f"{'run':<22}{'requests':>9}{'identical':>10}{'differing':>10}{'failed':>8}"
        f"{'max |diff|':>12}{'other class':>13}  slots used  classes"
    )
    lines = [head, "-" * len(head)]
    for v in verdicts:
        lines.append(
            f"{v.label:<22}{v.requests:>9}{v.identical:>10}{v.differing:>10}"
            f"{v.failed:>8}{v.max_abs_diff:>12.3g}{v.other_class:>13}  "
            f"{','.join(v.slots) or '-':<10}  {','.join(v.classes) or '-'}"
        )
    ok = all(v.ok for v in verdicts)
    lines.append(
        "VERDICT: "
        + (
            "IDENTICAL — every answer matched bitwise (scores, text, "
            "logprobs, seed, numerics class)"
            if ok
            else "DIFFERENT — see the differing/failed columns"
        )
    )
    return "\n".join(lines)
