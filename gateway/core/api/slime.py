"""slime's remote reward model (``--rm-type remote_rm``) as a ``/v1/rewards`` request.

slime (THUDM/slime, ``slime/rollout/rm_hub/__init__.py``, ``remote_rm``) posts one sample
to the whole ``--rm-url`` as ``{"prompt": sample.prompt, "response": sample.response,
"label": sample.label}``, raises on a non-2xx status (and retries, up to 10 times) and sets
``sample.reward = await resp.json()``: the answer is the reward itself, a bare JSON number.
Its group mode (``--group-rm``) changes when, not how: ``batched_async_rm`` sends the
samples of one prompt at once, still one such request each (a ``--custom-rm-path``
function may post the whole list instead: ``POST /slime/reward`` takes that too).

Each sample becomes a ``/v1/rewards`` item in the group of its prompt (``group_of``), so
the samples of one prompt meet on one slot whichever way they come, and is scored with
``gateway.default_reward_model`` like any item: same key, slot, seed and bits.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gateway.core.api.parsing import parse_json, validate
from gateway.core.api.schemas import SlimeRewardRequest, SlimeSample

#: The route slime's ``--rm-url`` names.
SLIME_PATH = "/slime/reward"


def parse(raw: bytes) -> tuple[list[SlimeSample], bool]:
    """A ``/slime/reward`` body's samples, and whether it was one sample (not a list)."""
    body = validate(SlimeRewardRequest, parse_json(raw, "a sample or a list of samples")).root
    return (body, False) if isinstance(body, list) else ([body], True)


def group_of(prompt: str | list[dict[str, Any]]) -> str:
    """A sample's group: ``sha256:`` and the hex digest of its prompt as canonical JSON
    (a text prompt as a JSON string, a chat prompt as its list of messages), the same for
    every sample of one prompt."""
    text = json.dumps(prompt, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def rewards_body(samples: list[SlimeSample]) -> bytes:
    """The ``/v1/rewards`` body of ``samples`` (no ``model``: the default reward model)."""
    items = []
    for s in samples:
        item: dict[str, Any] = (
            {"prompt": s.prompt} if isinstance(s.prompt, str) else {"messages": s.prompt}
        )
        item.update(response=s.response, label=s.label, group=group_of(s.prompt))
        items.append(item)
    return json.dumps({"items": items}, ensure_ascii=False).encode()


def answer(rewards: bytes, single: bool) -> bytes:
    """``/v1/rewards``' answer as slime reads it: the reward (a number, ``null`` where the
    item is masked) for one sample, the list of them for a list."""
    values = json.loads(rewards)["rewards"]
    return json.dumps(values[0] if single else values).encode()
