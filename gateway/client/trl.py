"""TRL drop-in: a reward function for ``GRPOTrainer(reward_funcs=[...])`` backed by a model
or a reward program of the gateway.

    from gateway.client.trl import reward_function
    math_reward = reward_function("http://127.0.0.1:8000", "math", label_key="answer")
    trainer = GRPOTrainer(..., reward_funcs=[math_reward])

TRL calls a reward function with ``prompts`` and ``completions`` (text or conversations)
and every other dataset column as a keyword; it logs each function's mean under the
function's ``__name__`` (here the model or program name). The label is taken from the
column ``label_key`` when given. A masked item (``on_failure: mask``) is None, which TRL
takes as "no reward from this function" (it sums rewards with ``nansum``). Imports no
TRL (it needs nothing of it) and no Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.client.reward_client import RewardClient


def _text(value: Any) -> str:
    """A TRL completion or prompt as text: a string, or a conversation's last message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return str(value)


def _item(prompt: Any, completion: Any, label: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"response": _text(completion)}
    if isinstance(prompt, list):
        item["messages"] = [dict(m) for m in prompt]
    else:
        item["prompt"] = _text(prompt)
    if label is not None:
        item["label"] = label
    return item


def reward_function(
    url: str,
    model: str,
    *,
    label_key: str | None = None,
    client: RewardClient | None = None,
    **client_kwargs: Any,
) -> Callable[..., list[float | None]]:
    """A TRL reward function scoring with ``model`` (a served model or a reward program)
    over ``/v1/rewards``; one request per call, results in order, the client's retries and
    deadline included. ``client_kwargs`` go to ``RewardClient`` (``batch_size``,
    ``concurrency``, ``timeout_s``)."""
    rc = client or RewardClient(url, model=model, progress=False, **client_kwargs)

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        labels = columns.get(label_key) if label_key else None
        labels = labels if labels is not None else [None] * len(completions)
        return rc.score(
            [_item(p, c, lab) for p, c, lab in zip(prompts, completions, labels, strict=True)],
            model,
        )

    reward.__name__ = model.replace("-", "_").replace(".", "_")
    reward.__qualname__ = reward.__name__
    reward.client = rc  # type: ignore[attr-defined]  # close it with reward.client.close()
    return reward
