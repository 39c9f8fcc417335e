"""``RewardClient``: score batches against an rmgate gateway from any Python trainer.

Depends on httpx (and optionally tqdm) only, never on Ray or vLLM, so ``pip install rmgate``
is enough on the trainer side. Every gateway call is idempotent (same body, same bits), which
is what makes retrying safe: a retried request cannot change a reward.

- bounded concurrency, results in submission order (never completion order);
- retries 5xx, 429 and 503 (honouring ``Retry-After``) and connection errors, with capped
  exponential backoff; 4xx other than 429 raise ``RewardRequestError`` at once;
- a total timeout for a whole batch; a progress bar for large batches.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import httpx

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class RewardRequestError(RuntimeError):
    """The gateway refused a request (4xx) or it kept failing past the retry budget."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        # Jitter spreads retries of many clients; it cannot change a result.
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s) * (0.5 + random.random() / 2)


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class RewardClient:
    """Client of one rmgate gateway.

    >>> client = RewardClient("http://127.0.0.1:8000", model="rm")
    >>> rewards = client.score([{"prompt": "2+3=", "response": "5"}])
    """

    def __init__(self, base_url: str, *, model: str | None = None, concurrency: int = 32,
                 batch_size: int = 16, timeout_s: float = 300.0,
                 total_timeout_s: float | None = None, retry: RetryPolicy | None = None,
                 progress: bool | None = None, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if "://" not in base_url:
            base_url = "http://" + base_url  # verl passes host:port
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = max(1, concurrency)
        self.batch_size = max(1, batch_size)
        self.timeout_s = timeout_s
        self.total_timeout_s = total_timeout_s
        self.retry = retry or RetryPolicy()
        self.progress = progress
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport

    # ---- low level --------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s,
                                 headers=self.headers, transport=self._transport,
                                 limits=httpx.Limits(max_connections=self.concurrency + 4))

    async def _post(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict:
        """POST with retries; the decoded JSON answer of a 200."""
        last = "no attempt made"
        for attempt in range(self.retry.max_attempts):
            retry_after = None
            try:
                resp = await client.post(path, json=body)
            except httpx.TransportError as exc:  # connection refused/reset, read timeout
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    return resp.json()
                try:
                    detail = resp.json()
                except ValueError:
                    detail = resp.text
                if resp.status_code not in RETRY_STATUSES:
                    raise RewardRequestError(f"{path} answered {resp.status_code}: {detail}",
                                             resp.status_code, detail)
                last = f"{resp.status_code}: {detail}"
                retry_after = resp.headers.get("retry-after")
            if attempt + 1 < self.retry.max_attempts:
                await asyncio.sleep(self.retry.delay(attempt, retry_after))
        raise RewardRequestError(f"{path} failed after {self.retry.max_attempts} attempts: {last}")

    async def _gather_ordered(self, jobs: list[Callable[[httpx.AsyncClient], Awaitable[T]]],
                              total: int, unit: str) -> list[T]:
        """Run ``jobs`` with bounded concurrency; results in submission order."""
        sem = asyncio.Semaphore(self.concurrency)
        bar = self._progress_bar(total, unit)
        results: list[Any] = [None] * len(jobs)

        async with self._client() as client:
            async def run(i: int) -> None:
                async with sem:
                    results[i] = await jobs[i](client)
                if bar is not None:
                    bar.update(len(results[i]) if isinstance(results[i], list) else 1)

            try:
                await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(len(jobs)))),
                                       self.total_timeout_s)
            except asyncio.TimeoutError:
                raise RewardRequestError(f"batch not done within {self.total_timeout_s}s") from None
            finally:
                if bar is not None:
                    bar.close()
        return results

    def _progress_bar(self, total: int, unit: str) -> Any:
        show = self.progress if self.progress is not None else total >= 1000
        if not show:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        return tqdm(total=total, unit=unit, desc="rmgate")

    # ---- async API --------------------------------------------------------------------
    async def ascore(self, items: Sequence[dict[str, Any]], model: str | None = None) -> list[float]:
        """Rewards of ``items`` ({prompt or messages, response, label?}) via /v1/rewards."""
        return [r for r, _ in await self.ascore_detailed(items, model)]

    async def ascore_detailed(self, items: Sequence[dict[str, Any]],
                              model: str | None = None) -> list[tuple[float, dict[str, Any]]]:
        model = model or self.model
        chunks = _chunks(list(items), self.batch_size)

        def job(chunk: Sequence[dict[str, Any]]):
            async def call(client: httpx.AsyncClient) -> list[tuple[float, dict]]:
                body: dict[str, Any] = {"items": list(chunk)}
                if model:
                    body["model"] = model
                out = await self._post(client, "/v1/rewards", body)
                return list(zip(out["rewards"], out["details"]))
            return call

        parts = await self._gather_ordered([job(c) for c in chunks], len(items), "item")
        return [x for part in parts for x in part]

    async def aclassify(self, texts: Sequence[str], model: str | None = None,
                        use_activation: bool = False) -> list[float]:
        """The last class score of each text via /classify (raw logit by default)."""
        model = model or self.model
        chunks = _chunks(list(texts), self.batch_size)

        def job(chunk: Sequence[str]):
            async def call(client: httpx.AsyncClient) -> list[float]:
                body: dict[str, Any] = {"input": list(chunk), "use_activation": use_activation}
                if model:
                    body["model"] = model
                out = await self._post(client, "/classify", body)
                return [d["probs"][-1] for d in out["data"]]
            return call

        parts = await self._gather_ordered([job(c) for c in chunks], len(texts), "text")
        return [x for part in parts for x in part]

    async def achat(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chat completion responses (JSON) for each request body, in order."""
        def job(body: dict[str, Any]):
            async def call(client: httpx.AsyncClient) -> dict[str, Any]:
                return await self._post(client, "/v1/chat/completions",
                                        {"model": self.model, **body} if self.model else body)
            return call

        return await self._gather_ordered([job(b) for b in requests], len(requests), "request")

    # ---- sync API ---------------------------------------------------------------------
    def score(self, items: Sequence[dict[str, Any]], model: str | None = None) -> list[float]:
        return run_sync(self.ascore(items, model))

    def score_detailed(self, items: Sequence[dict[str, Any]], model: str | None = None):
        return run_sync(self.ascore_detailed(items, model))

    def classify(self, texts: Sequence[str], model: str | None = None,
                 use_activation: bool = False) -> list[float]:
        return run_sync(self.aclassify(texts, model, use_activation))

    def chat(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return run_sync(self.achat(requests))


def run_sync(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion from sync code, also when a loop already runs here
    (Jupyter, verl's async workers): then it runs on a private thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="rmgate-client")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


__all__ = ["RewardClient", "RewardRequestError", "RetryPolicy", "run_sync"]
