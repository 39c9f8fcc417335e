"""verl drop-in: ``compute_score`` (and ``compute_score_batch``) for ``custom_reward_function``.

    reward.custom_reward_function.path=<site-packages>/gateway/client/verl.py
    reward.custom_reward_function.name=compute_score          # or compute_score_async
    +reward.custom_reward_function.reward_kwargs.reward_router_address=127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.model=rm     # a DisRM, a GRM judge or a program

The score comes from rmgate's ``/v1/rewards``: for a DisRM the gateway scores the chat
conversation prompt messages + assistant response with the model's own chat template (the
same tokens verl's built-in ``/classify`` path sends: template applied, BOS once) and
returns the raw logit ``data[-1].probs[-1]``; for a GRM it asks the judge with the model's
configured template and parses the score. Same inputs, same bits, every run.

The prompt is taken from ``extra_info`` (``messages``, ``raw_prompt``, ``prompt`` or
``question``) or from a ``prompt`` keyword. Imports no Ray and no vLLM.

verl calls ``compute_score`` once per sample, from several executor threads at once. One
``RewardClient`` per (address, model) is cached in ``_CLIENTS``, and its sync API runs on one
private loop thread with one keep-alive pool, so all those calls share at most 64 TCP
connections to the gateway instead of opening one per sample.

``compute_score_batch`` is the same for verl's batch reward manager (verl up to 0.8:
``reward_model.reward_manager=batch``; verl 0.9's reward loop has no ``batch`` manager),
which calls it once per batch with lists::

    reward_model.reward_manager=batch
    custom_reward_function.path=<site-packages>/gateway/client/verl.py
    custom_reward_function.name=compute_score_batch
    +custom_reward_function.reward_kwargs.reward_router_address=127.0.0.1:8000
    +custom_reward_function.reward_kwargs.model=rm

It sends the whole batch in one ``score_detailed`` call, each item in the group of its
prompt (``group_of``): the samples GRPO draws for one prompt meet on one slot. verl keeps
GRPO's ``uid`` in ``data.non_tensor_batch["uid"]``, which the batch manager does not pass;
it passes each sample's dataset ``extra_info``, which the samples of one prompt share
(verl repeats the row), so the group is ``extra_info["uid"]`` where a pipeline put it
there, else the row's ``extra_info["index"]`` (verl's data_preprocess scripts write it)
with the data source; a sample with neither is placed alone. Groups decide placement
only: every reward is the bits of its item sent alone.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from typing import Any

from gateway.client import RewardClient

_CLIENTS: dict[tuple[str, str | None], RewardClient] = {}
# Two executor threads scoring their first sample at once must not both build a client
# (the loser's pool and loop thread would be left behind): creation happens under this lock.
_CLIENTS_LOCK = threading.Lock()
PROMPT_KEYS = ("messages", "raw_prompt", "prompt", "question")
#: The longest ``group`` /v1/rewards takes; a longer one is sent as its sha256.
GROUP_MAX = 256


def _client(address: str | None, model: str | None) -> RewardClient:
    address = address or os.environ.get("RMGATE_URL")
    if not address:
        raise ValueError(
            "rmgate: pass reward_kwargs.reward_router_address=host:port (or set RMGATE_URL)"
        )
    key = (address, model)
    client = _CLIENTS.get(key)  # the common case, lock-free (a dict read is atomic)
    if client is None:
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = RewardClient(
                    address, model=model, concurrency=64, progress=False
                )
    return client


def build_item(
    solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, prompt: Any = None
) -> dict[str, Any]:
    """The /v1/rewards item for one verl sample."""
    source = prompt
    if source is None and extra_info:
        source = next((extra_info[k] for k in PROMPT_KEYS if extra_info.get(k) is not None), None)
    item: dict[str, Any] = {"response": solution_str}
    if isinstance(source, (list, tuple)):
        item["messages"] = [dict(m) for m in source]
    else:
        item["prompt"] = "" if source is None else str(source)
    if ground_truth is not None:
        item["label"] = (
            ground_truth if isinstance(ground_truth, (str, int, float)) else str(ground_truth)
        )
    return item


def _result(reward: float | None, detail: dict[str, Any]) -> dict[str, Any]:
    """verl's result dict: verl reads "score" and logs the other keys, so they are numeric
    and the same every call. The gateway's detail carries ``slot`` as an int (``int()`` also
    takes a digit string); a detail without one counts as slot 0. A reward program's
    detail adds one ``rmgate_<component>`` per component (its transformed score, 0.0 where
    it failed), ``rmgate_failed_components`` and ``rmgate_default_used``.

    A masked item (``on_failure: mask``): verl's ``score`` must be a number, so it is 0.0
    and ``rmgate_masked`` is 1.0 (0.0 for every scored item): verl keeps it in
    ``reward_extra_info``, where a trainer's loss mask can read it."""
    out = {
        "score": float(reward) if reward is not None else 0.0,
        "rmgate_masked": float(reward is None),
        "rmgate_slot": int(detail.get("slot", 0)),
        "rmgate_parsed": float(detail.get("parsed", True)),
    }
    components = detail.get("components")
    if isinstance(components, list):
        for comp in components:
            value = comp.get("transformed")
            out[f"rmgate_{comp['name']}"] = float(value) if value is not None else 0.0
        out["rmgate_failed_components"] = float(len(detail.get("failed") or []))
        out["rmgate_default_used"] = float(bool(detail.get("default_used")))
    return out


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    *,
    reward_router_address: str | None = None,
    model: str | None = None,
    prompt: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """verl's custom reward function (sync; verl runs it in an executor)."""
    item = build_item(solution_str, ground_truth, extra_info, prompt)
    reward, detail = _client(reward_router_address, model).score_detailed([item])[0]
    return _result(reward, detail)


async def compute_score_async(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    *,
    reward_router_address: str | None = None,
    model: str | None = None,
    prompt: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """The same as ``compute_score`` for verl's async reward loop."""
    item = build_item(solution_str, ground_truth, extra_info, prompt)
    reward, detail = (await _client(reward_router_address, model).ascore_detailed([item]))[0]
    return _result(reward, detail)


def group_of(data_source: Any, extra_info: dict[str, Any] | None) -> str | None:
    """A verl sample's ``group`` (see the module docstring): ``uid:<uid>`` from
    ``extra_info["uid"]``, else ``index:<data source>:<index>`` from the dataset row's
    ``extra_info["index"]``; None (placed alone) without either."""
    if not extra_info:
        return None
    if extra_info.get("uid") is not None:
        group = f"uid:{extra_info['uid']}"
    elif extra_info.get("index") is not None:
        group = f"index:{data_source}:{extra_info['index']}"
    else:
        return None
    if len(group) > GROUP_MAX:
        group = "sha256:" + hashlib.sha256(group.encode()).hexdigest()
    return group


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None] | None = None,
    *,
    reward_router_address: str | None = None,
    model: str | None = None,
    **_: Any,
) -> list[dict[str, Any]]:
    """verl's batch reward function (``reward_model.reward_manager=batch``): one result
    dict per sample, in order, from one ``score_detailed`` call; each item grouped by
    ``group_of``."""
    extras = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    items = []
    for source, solution, truth, extra in zip(
        data_sources, solution_strs, ground_truths, extras, strict=True
    ):
        item = build_item(solution, truth, extra)
        group = group_of(source, extra)
        if group is not None:
            item["group"] = group
        items.append(item)
    scored = _client(reward_router_address, model).score_detailed(items)
    return [_result(reward, detail) for reward, detail in scored]
