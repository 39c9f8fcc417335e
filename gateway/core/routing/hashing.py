"""Consistent hashing of request keys onto stable slots.

Jump consistent hash (Lamping & Veach, 2014): O(ln N) time, no memory, perfectly even in
expectation, and on N -> N+1 only the keys that land on the new slot move (about 1/(N+1)).
Plain ``crc32 % N`` would move about N/(N+1) of all keys on every scale event.
"""

from __future__ import annotations

from gateway.core.routing.keys import MASK64, splitmix64


def jump_hash(key64: int, num_buckets: int) -> int:
    """Lamping & Veach's jump consistent hash: bucket in [0, num_buckets)."""
    if num_buckets < 1:
        raise ValueError("num_buckets must be >= 1")
    b, j = -1, 0
    key = key64 & MASK64
    while j < num_buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def slot_for_key(key: int, num_slots: int) -> int:
    """The slot of a 32-bit request key among ``num_slots`` stable slots."""
    return jump_hash(splitmix64(key), num_slots)


def slot_ranking(key: int, num_slots: int) -> list[int]:
    """Every slot in ``key``'s preference order: its own slot first, then the others by a
    per-(key, slot) score (rendezvous over splitmix64, not crc32: CRC is linear and would
    rank poorly). Failover walks this order, so it is deterministic per key."""
    own = slot_for_key(key, num_slots)
    mixed = splitmix64(key)
    others = sorted(
        (s for s in range(num_slots) if s != own),
        key=lambda s: splitmix64(mixed ^ splitmix64(s + 1)),
        reverse=True,
    )
    return [own, *others]
