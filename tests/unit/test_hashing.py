"""Jump consistent hash over slots: minimal movement on N -> N+1, even load."""

import random

import pytest

from gateway.core.routing.hashing import jump_hash, slot_for_key

RNG = random.Random(1234)
SAMPLE = [RNG.getrandbits(32) for _ in range(100_000)]


@pytest.mark.parametrize("n", range(1, 17))
def test_scaling_up_moves_at_most_its_share(n):
    before = [slot_for_key(k, n) for k in SAMPLE]
    after = [slot_for_key(k, n + 1) for k in SAMPLE]
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert all(a == n for _, a in moved), "a moved key may only go to the new slot"
    assert len(moved) / len(SAMPLE) <= 1 / (n + 1) + 0.01


@pytest.mark.parametrize("n", range(1, 17))
def test_load_is_balanced(n):
    counts = [0] * n
    for k in SAMPLE:
        counts[slot_for_key(k, n)] += 1
    assert max(counts) / (len(SAMPLE) / n) <= 1.05


def test_plain_modulo_would_move_most_keys():
    """The control: crc % N moves ~N/(N+1) of keys, which is why it is not used."""
    moved = sum((k % 4) != (k % 5) for k in SAMPLE) / len(SAMPLE)
    assert moved > 0.7


def test_jump_hash_range_and_argument_check():
    assert {jump_hash(k, 7) for k in SAMPLE[:2000]} == set(range(7))
    assert jump_hash(123456789, 1) == 0
    with pytest.raises(ValueError):
        jump_hash(1, 0)
