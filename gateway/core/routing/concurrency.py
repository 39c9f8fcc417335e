"""All of a request's parts, or none: the first failure cancels the rest.

A list input (``/classify`` with a list, ``/v1/rewards`` items) runs one engine request per
item. ``asyncio.gather`` would leave the siblings of a failed item running (and their engines
computing for an answer nobody would read); a ``TaskGroup`` cancels them, which closes
their engine connections, which makes vLLM abort them. The caller sees the failure that
ended the request (the first one raised), not an ``ExceptionGroup``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


async def all_or_cancel(parts: Iterable[Awaitable[T]]) -> list[T]:
    """The parts' results in order; on the first failure the others are cancelled and that
    failure is raised as itself. Cancelling the caller cancels every part.

    One part (a trainer's single-input request, the common case) runs in the caller's own
    task: the same semantics without a task group and a task per request."""
    parts = list(parts)
    if len(parts) == 1:
        return [await parts[0]]
    tasks: list[asyncio.Task[T]] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(part) for part in parts]  # type: ignore[arg-type]
    except BaseExceptionGroup as failed:
        raise _first(failed) from None
    return [task.result() for task in tasks]
