"""Request keys: canonical JSON -> crc32 -> 64-bit mix, and the seed derived from a key.

Why canonical JSON and not the raw bytes: trainers serialize the same request differently
(aiohttp's ``json.dumps`` defaults use ``", "`` and ASCII escapes, httpx writes compact
UTF-8), and key order is whatever the dict had. The key must only depend on what the model
will see, so fields that cannot change the output are dropped before hashing.

Why crc32: it is the user's choice, tiny and platform independent (never Python's
``hash()``, which is salted per process). Its 32 bits are spread to 64 with splitmix64
before they drive the consistent hash, because jump hash wants well-mixed 64-bit input.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

#: Request fields that cannot change what the model computes; left out of the key.
IGNORED_FIELDS = frozenset({"stream", "stream_options", "user", "request_id", "priority"})

MASK64 = (1 << 64) - 1
#: Seeds handed to vLLM stay in the positive int32 range every client library accepts.
SEED_MASK = (1 << 31) - 1


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8 (no ASCII escapes), NaN refused."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def key_material(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the key is computed over: the endpoint and the body minus ignored fields."""
    return {
        "endpoint": endpoint,
        "body": {k: v for k, v in body.items() if k not in IGNORED_FIELDS},
    }


def request_key(endpoint: str, body: dict[str, Any]) -> int:
    """crc32 of the canonical key material: the request's identity (32 bits)."""
    return zlib.crc32(canonical_json(key_material(endpoint, body))) & 0xFFFFFFFF


def group_key(model: str, group: str) -> int:
    """The placement key of a group's items on ``model`` (crc32, as ``request_key``): every
    item of the group is placed by it, not by its own key, so the group lands on one slot
    and the items that share a prompt meet on one engine."""
    return zlib.crc32(canonical_json({"model": model, "group": group})) & 0xFFFFFFFF


def splitmix64(x: int) -> int:
    """One splitmix64 step (Steele, Lea, Flood): a bijective 64-bit mixer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(key: int, base: int = 0) -> int:
    """The sampling seed of a request that did not send one: a pure function of its key.

    Mixed twice with a different constant from the routing mix, so that the seed and the
    slot are not correlated.
    """
    return splitmix64(splitmix64(key ^ 0x5EED_0000_0000) ^ (base & MASK64)) & SEED_MASK
