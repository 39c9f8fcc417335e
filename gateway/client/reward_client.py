"""``RewardClient``: score batches against an rmgate gateway from any Python trainer.

Depends on httpx (and optionally tqdm) only, never on Ray or vLLM, so ``pip install rmgate``
is enough on the trainer side. Every gateway call is idempotent (same body, same bits), which
is what makes retrying safe: a retried request cannot change a reward.

- bounded concurrency, results in submission order (never completion order);
- one budget per request (``timeout_s``), retries included: each attempt gets what is left
  of it, and tells the gateway (``x-rmgate-timeout``), so a request never takes longer
  than the caller's timeout however often it is retried;
- retries only what is safe to retry: connection errors, 429 and 503 (honouring
  ``Retry-After``) and 504, with capped, jittered exponential backoff; any other status
  (4xx, a 500, a 502 the gateway gave after its own engine retries) raises
  ``RewardRequestError`` at once;
- a total timeout for a whole batch; a progress bar for large batches;
- connection reuse: one keep-alive pool of at most ``concurrency`` connections per client and
  event loop, and one private event loop thread for the whole sync API, so per-sample callers
  (verl's ``compute_score``, from several threads) share TCP connections instead of opening
  one per call. ``close()``/``aclose()`` or ``with``/``async with`` release them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import httpx

from gateway.client.trace_context import inject_trace_context

T = TypeVar("T")
#: What a retry can fix: the gateway refused for now (429, 503: overload, a slot
#: restarting) or the deadline passed (504). Every request is idempotent, so a retry can
#: never change a reward; a 500 or 502 would only fail again.
RETRY_STATUSES = frozenset({429, 503, 504})
#: The header that carries a request's remaining budget to the gateway's deadline.
TIMEOUT_HEADER = "x-rmgate-timeout"


class RewardRequestError(RuntimeError):
    """The gateway refused a request (4xx) or it kept failing past the retry budget."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


#: The retries' own random stream: jitter drawn from the global ``random`` would advance the
#: trainer's Python random state on every retry (timing-dependent), and with it anything the
#: trainer samples from ``random`` afterwards.
_JITTER = random.Random()


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
        return min(self.backoff_s * 2**attempt, self.max_backoff_s) * (0.5 + _JITTER.random() / 2)


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# close() called from inside the loop that owns a pool cannot block on it: it schedules the
# pool's aclose() there instead, and the task is kept alive here until it is done.
_CLOSING: set[asyncio.Task[None]] = set()
_CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class _LoopPool:
    """The pool of one caller's event loop and the guard generator that closes it."""

    pool: httpx.AsyncClient
    guard: AsyncGenerator[None, None]


async def _guard(pool: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """Suspended at ``yield`` for the life of ``pool``; closing it closes the pool.

    Once first iterated in a loop it is known to that loop's async-generator hooks, so the
    loop's ``shutdown_asyncgens()`` (run by ``asyncio.run`` and pytest-asyncio before the
    loop closes) closes the pool in the loop it belongs to: a caller's loop ending cannot
    strand open connections in the client.
    """
    try:
        yield
    finally:
        await pool.aclose()


class _LoopThread:
    """A private event loop running in a daemon thread, plus the pool bound to that loop.

    Holds no reference to its ``RewardClient`` so that a client which is dropped without
    ``close()`` can still be garbage-collected; a ``weakref.finalize`` then stops this thread.
    ``pool`` is only touched from the loop's own thread (created lazily by the first call,
    closed in the thread's shutdown sequence), so it needs no lock.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool: httpx.AsyncClient | None = None
        self.thread = threading.Thread(target=self._serve, name="rmgate-client", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # Calls still in flight at close() are cancelled (their callers see CancelledError),
            # then the keep-alive connections are closed in the loop they belong to.
            while pending := asyncio.all_tasks(loop):
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            pool, self.pool = self.pool, None
            try:
                if pool is not None:
                    loop.run_until_complete(pool.aclose())
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop; block the calling thread until it is done."""
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed: close() won a race with this call
            coro.close()
            raise RuntimeError("RewardClient is closed") from None
        try:
            # Poll rather than wait forever: a call that raced with close() may land in a loop
            # that stops before running it, and then its future is never resolved.
            while True:
                try:
                    return future.result(timeout=1.0)
                except concurrent.futures.TimeoutError:
                    if not self.thread.is_alive() and not future.done():
                        raise RuntimeError("RewardClient was closed during the call") from None
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt in the caller: do not leave it running
            raise

    def stop(self, join: bool = True) -> None:
        """Stop the loop (idempotent); ``join`` waits for its pool to be closed."""
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # the loop is already closed
            return
        if join and threading.current_thread() is not self.thread:
            self.thread.join(_CLOSE_WAIT_S)


class RewardClient:
    """Client of one rmgate gateway.

    >>> with RewardClient("http://127.0.0.1:8000", model="rm") as client:
    ...     rewards = client.score([{"prompt": "2+3=", "response": "5"}])

    ``timeout_s`` is each request's whole budget, its retries included (the gateway is told
    what is left of it); ``total_timeout_s`` bounds a whole batch; ``retry`` caps the
    attempts and shapes the backoff within the budget.

    Connections are reused across calls: the client keeps one ``httpx.AsyncClient`` (a
    keep-alive pool of at most ``concurrency`` connections) per event loop it is used in,
    because an ``AsyncClient`` is bound to the loop it first ran in. The sync API (``score``,
    ``score_detailed``, ``classify``, ``chat``) runs every call on one private event loop in
    a daemon thread owned by the client, so sync calls from any number of threads (verl runs
    ``compute_score`` per sample in an executor) share a single pool; that also makes the sync
    API usable from inside a running event loop. ``close()`` / ``aclose()`` (or ``with`` /
    ``async with``) close every pool and stop the thread; a client dropped without closing
    stops its thread when garbage-collected. A pool made in a caller's loop is also closed
    when that loop shuts down its async generators (``asyncio.run`` does, on exit), so
    ``asyncio.run(client.ascore(...))`` per call leaves no connection behind (but reuses
    none either: use the sync API or one long-lived loop for that). Only a loop closed
    without that shutdown (``loop.close()`` by hand) leaves its pool to the garbage collector.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        concurrency: int = 32,
        batch_size: int = 16,
        timeout_s: float = 300.0,
        total_timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        progress: bool | None = None,
        api_key: str | None = None,
        admin_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
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
        #: What sleep and wake send: the admin key when the gateway has API keys.
        self.admin_headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._transport = transport
        # Guards _pools, _runner and _closed: sync callers arrive from many threads.
        self._lock = threading.Lock()
        # Pools of callers' loops, each with the guard generator that closes it (_guard).
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._runner: _LoopThread | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    # ---- connections ------------------------------------------------------------------
    def _new_pool(self) -> httpx.AsyncClient:
        # At most `concurrency` connections, all kept alive between calls: the connection
        # count a gateway sees from one client is bounded by `concurrency`, whatever the
        # number of calls. (httpx ignores `limits` when a `transport` is injected.)
        return httpx.AsyncClient(
            base_url=self.base_url,
            timeout=self.timeout_s,
            headers=self.headers,
            transport=self._transport,
            limits=httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            ),
        )

    async def _pool(self) -> httpx.AsyncClient:
        """The pool of the running event loop, created on first use in that loop."""
        loop = asyncio.get_running_loop()
        runner = self._runner
        if runner is not None and loop is runner.loop:
            if self._closed:
                raise RuntimeError("RewardClient is closed")
            if runner.pool is None:  # only this loop's thread gets here: no lock needed
                runner.pool = self._new_pool()
            return runner.pool
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardClient is closed")
            # Pools of loops that have ended can never be used again (their guard closed them).
            for dead in [lp for lp in self._pools if lp.is_closed()]:
                del self._pools[dead]
            entry = self._pools.get(loop)
            if entry is not None and not entry.pool.is_closed:
                return entry.pool
            pool = self._new_pool()
            entry = self._pools[loop] = _LoopPool(pool, _guard(pool))
        # Runs to the guard's `yield` without suspending, so no other task of this loop can
        # see the entry before its guard is registered with the loop's async-generator hooks.
        await entry.guard.__anext__()
        return pool

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's private loop thread (started on first use)."""
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("RewardClient is closed")
            runner = self._runner
            if runner is None:
                runner = self._runner = _LoopThread()
                # A client dropped without close() must not leave its thread behind.
                self._finalizer = weakref.finalize(self, runner.stop, False)
        if threading.current_thread() is runner.thread:
            coro.close()
            raise RuntimeError(
                "a sync RewardClient method was called from the client's own "
                "loop thread; await the async method (ascore, ...) instead"
            )
        return runner.submit(coro)

    def close(self) -> None:
        """Close every connection pool and stop the private loop thread (idempotent).

        A pool bound to another running loop is closed in that loop; when called from inside
        that very loop (where blocking would deadlock) its closing is scheduled there, so from
        async code prefer ``await aclose()``.
        """
        with self._lock:
            self._closed = True
            pools = list(self._pools.items())
            self._pools.clear()
            runner, self._runner = self._runner, None
            finalizer, self._finalizer = self._finalizer, None
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, entry in pools:
            _close_pool(loop, entry.guard, current)
        if finalizer is not None:
            finalizer.detach()
        if runner is not None:
            runner.stop(join=True)

    async def aclose(self) -> None:
        """``close()`` for async code: this loop's pool is awaited here, the rest (other
        loops, the private loop thread) is closed from a worker thread (idempotent)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._pools.pop(loop, None)
            self._closed = True
        if entry is not None:
            await entry.guard.aclose()  # closes the pool
        await asyncio.to_thread(self.close)

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> RewardClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ---- low level --------------------------------------------------------------------

    async def _post(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict:
        """POST with retries within the request's budget (``timeout_s``); the decoded JSON
        answer of a 200."""
        budget = self.timeout_s
        deadline = time.monotonic() + budget
        last = "no attempt made"
        attempts = 0
        while attempts < self.retry.max_attempts:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            attempts += 1
            retry_after = None
            # the gateway's deadline is what is left of ours (it caps it at its own); the
            # caller's trace context, if it traces (gateway.client.trace_context)
            headers = {TIMEOUT_HEADER: f"{left:.3f}"}
            inject_trace_context(headers)
            try:
                resp = await client.post(path, json=body, timeout=left, headers=headers)
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
                    raise RewardRequestError(
                        f"{path} answered {resp.status_code}: {detail}", resp.status_code, detail
                    )
                last = f"{resp.status_code}: {detail}"
                retry_after = resp.headers.get("retry-after")
            if attempts >= self.retry.max_attempts:
                break
            pause = self.retry.delay(attempts - 1, retry_after)
            if time.monotonic() + pause >= deadline:
                break  # the next attempt would start past the budget
            await asyncio.sleep(pause)
        raise RewardRequestError(
            f"{path} failed after {attempts} attempts within its {budget:g}s budget: {last}"
        )

    async def _gather_ordered(
        self, jobs: list[Callable[[httpx.AsyncClient], Awaitable[T]]], total: int, unit: str
    ) -> list[T]:
        """Run ``jobs`` with bounded concurrency; results in submission order.

        The semaphore is made per call, in the loop running this call (asyncio primitives
        belong to one loop); the pool is shared by all calls in this loop and caps the
        connections of concurrent calls together at ``concurrency``.
        """
        client = await self._pool()
        sem = asyncio.Semaphore(self.concurrency)
        bar = self._progress_bar(total, unit)
        results: list[Any] = [None] * len(jobs)

        async def run(i: int) -> None:
            async with sem:
                results[i] = await jobs[i](client)
            if bar is not None:
                bar.update(len(results[i]) if isinstance(results[i], list) else 1)

        try:
            await asyncio.wait_for(
                asyncio.gather(*(run(i) for i in range(len(jobs)))), self.total_timeout_s
            )
        except TimeoutError:
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
    async def ascore(
        self, items: Sequence[dict[str, Any]], model: str | None = None
    ) -> list[float | None]:
        """Rewards of ``items`` ({prompt or messages, response, label?, group?}) via
        /v1/rewards; None where the item is masked (``on_failure: mask``)."""
        return [r for r, _ in await self.ascore_detailed(items, model)]

    async def ascore_detailed(
        self, items: Sequence[dict[str, Any]], model: str | None = None
    ) -> list[tuple[float | None, dict[str, Any]]]:
        model = model or self.model
        chunks = _chunks(list(items), self.batch_size)

        def job(chunk: Sequence[dict[str, Any]]):
            async def call(client: httpx.AsyncClient) -> list[tuple[float | None, dict]]:
                body: dict[str, Any] = {"items": list(chunk)}
                if model:
                    body["model"] = model
                out = await self._post(client, "/v1/rewards", body)
                return list(zip(out["rewards"], out["details"]))

            return call

        parts = await self._gather_ordered([job(c) for c in chunks], len(items), "item")
        return [x for part in parts for x in part]

    async def aclassify(
        self, texts: Sequence[str], model: str | None = None, use_activation: bool = False
    ) -> list[float]:
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
                return await self._post(
                    client,
                    "/v1/chat/completions",
                    {"model": self.model, **body} if self.model else body,
                )

            return call

        return await self._gather_ordered([job(b) for b in requests], len(requests), "request")

    # ---- sync API ---------------------------------------------------------------------
    # All four run on the client's private loop thread (see the class docstring), also when
    # called from inside a running event loop.
    def score(
        self, items: Sequence[dict[str, Any]], model: str | None = None
    ) -> list[float | None]:
        return self._run(self.ascore(items, model))

    def score_detailed(
        self, items: Sequence[dict[str, Any]], model: str | None = None
    ) -> list[tuple[float | None, dict[str, Any]]]:
        return self._run(self.ascore_detailed(items, model))

    def classify(
        self, texts: Sequence[str], model: str | None = None, use_activation: bool = False
    ) -> list[float]:
        return self._run(self.aclassify(texts, model, use_activation))

    def chat(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._run(self.achat(requests))

    # ---- sleep and wake (a colocated trainer's phases) --------------------------------
    async def _control(
        self, method: str, path: str, params: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        client = await self._pool()
        params = {k: v for k, v in params.items() if v is not None}
        resp = await client.request(
            method, path, params=params, timeout=timeout_s, headers=self.admin_headers
        )
        if resp.status_code != 200:
            try:
                detail: Any = resp.json()
            except ValueError:
                detail = resp.text
            raise RewardRequestError(
                f"{path} answered {resp.status_code}: {detail}", resp.status_code, detail
            )
        return resp.json()

    async def sleep_async(self, level: int = 1, model: str | None = None) -> dict[str, Any]:
        """``POST /sleep?level=``: every slot of ``model`` (default: every model) frees its
        engine's memory (level 1 keeps the weights in host memory, 2 drops them)."""
        return await self._control("POST", "/sleep", {"level": level, "model": model}, 600.0)

    async def wake_up_async(self, model: str | None = None) -> dict[str, Any]:
        """``POST /wake_up``: every slot back, its numerics re-proved before it serves."""
        return await self._control("POST", "/wake_up", {"model": model}, max(self.timeout_s, 600.0))

    async def is_sleeping_async(self, model: str | None = None) -> bool:
        """``GET /is_sleeping``."""
        return bool(
            (await self._control("GET", "/is_sleeping", {"model": model}, 60.0))["is_sleeping"]
        )

    def sleep(self, level: int = 1, model: str | None = None) -> dict[str, Any]:
        return self._run(self.sleep_async(level, model))

    def wake_up(self, model: str | None = None) -> dict[str, Any]:
        return self._run(self.wake_up_async(model))

    def is_sleeping(self, model: str | None = None) -> bool:
        return self._run(self.is_sleeping_async(model))

    @contextlib.contextmanager
    def awake(self, model: str | None = None, level: int = 1) -> Iterator[RewardClient]:
        """The reward phase of a colocated trainer: the model woken on entry (its numerics
        re-proved), put back to sleep at ``level`` on exit, also when the phase raises.

        >>> with client.awake():
        ...     rewards = client.score(batch)
        """
        self.wake_up(model)
        try:
            yield self
        finally:
            self.sleep(level, model)


def _close_pool(
    loop: asyncio.AbstractEventLoop,
    guard: AsyncGenerator[None, None],
    current: asyncio.AbstractEventLoop | None,
) -> None:
    """Close a pool bound to ``loop`` (through its ``guard``) from sync code running in
    ``current`` (or none)."""
    if loop.is_closed():
        return  # its loop is gone: shutdown_asyncgens() closed the pool, or nothing can
    if loop is current:  # blocking here would deadlock: schedule it in this loop
        task = loop.create_task(guard.aclose())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)
        return
    try:
        if loop.is_running():  # another thread runs that loop
            future = asyncio.run_coroutine_threadsafe(guard.aclose(), loop)
            try:
                future.result(_CLOSE_WAIT_S)
            except concurrent.futures.TimeoutError:
                future.cancel()
        else:  # idle loop (e.g. between two asyncio tests): run it here for the close
            loop.run_until_complete(guard.aclose())
    except (RuntimeError, httpx.HTTPError, OSError):
        pass  # best effort: the loop ended meanwhile or the socket is already gone


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
