"""The placement policy alone (pure: no Ray, no HTTP): numerics classes, bounded load within
a class, the key's own ranking, strict vs mixed, and the pinned behaviour it falls back to."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.routing.hashing import slot_for_key, slot_ranking
from gateway.core.routing.numerics import ModelClasses, class_id
from gateway.core.routing.placement import bounded_choice, place, place_in_class, takes_waiter

KW = dict(failover="wait", slot_wait_s=120.0, failover_after_s=5.0, load_bound=1.25)


def test_class_id_is_a_short_hash_of_identity_and_digest():
    a = class_id({"dtype": "float32", "device": "cpu"}, "d1")
    assert len(a) == 12 and a == class_id({"device": "cpu", "dtype": "float32"}, "d1")
    assert a != class_id({"dtype": "bfloat16", "device": "cpu"}, "d1")
    assert a != class_id({"dtype": "float32", "device": "cpu"}, "d2")


def test_grouping_majority_and_strict_drain():
    c = ModelClasses(("A", "A", "B", None))
    assert c.groups == {"A": [0, 1], "B": [2]} and c.majority == "A"
    assert c.drained(2) and not c.drained(0) and not c.drained(3)
    assert "majority class A" in c.drain_reason(2)
    assert c.mates(0) == [0, 1] and c.mates(2) == [0, 1] and c.mates(3) == [3]
    mixed = ModelClasses(("A", "A", "B", None), "mixed")
    assert not mixed.drained(2) and mixed.mates(2) == [2]


@pytest.mark.parametrize("key", range(0, 2**32, 2**32 // 97))
def test_an_idle_gateway_places_every_key_on_its_own_slot(key):
    classes = ModelClasses(("A",) * 4)
    p = place_in_class(key, classes, {s: 0 for s in range(4)}, **KW)
    assert p.first == p.home == slot_for_key(key, 4) and p.reason == "preferred"
    # every class mate follows, in the key's own ranking; the last waits the full budget
    assert [s for s, _ in p.candidates] == slot_ranking(key, 4)
    assert [w for _, w in p.candidates] == [0.0, 0.0, 0.0, 120.0]
    assert p.within_class and p.numerics_class == "A"


def test_a_loaded_own_slot_gives_its_key_to_the_next_class_mate_in_ranking():
    key = 12345
    ranking = slot_ranking(key, 3)
    load = {ranking[0]: 10, ranking[1]: 0, ranking[2]: 0}
    p = place_in_class(key, ModelClasses(("A",) * 3), load, **KW)
    assert p.first == ranking[1] and p.reason == "load" and p.home == ranking[0]


def test_bounded_choice_is_the_least_loaded_when_every_member_is_full():
    assert bounded_choice([2, 0, 1], {2: 9, 0: 9, 1: 9}, 1.0) == 2  # tie: ranking order
    assert bounded_choice([2, 0, 1], {2: 3, 0: 1, 1: 2}, 1.0) == 0  # capacity ceil(7/3) = 3
    assert bounded_choice([2, 0, 1], {2: 1, 0: 1, 1: 0}, 1.25) == 2  # capacity ceil(1.25) = 2
    assert bounded_choice([2, 0, 1], {2: 1, 0: 0, 1: 0}, 1.25) == 0  # capacity 1: move on


def test_keys_never_leave_their_own_slots_class():
    classes = ModelClasses(("A", "B", "A", "B"), "mixed")
    for key in range(0, 2**32, 2**32 // 500):
        home = slot_for_key(key, 4)
        p = place_in_class(key, classes, {0: 50, 1: 50, 2: 0, 3: 0}, **KW)
        assert {classes.classes[s] for s, _ in p.candidates} == {classes.classes[home]}


def test_strict_sends_a_drained_slots_keys_to_the_majority_class():
    classes = ModelClasses(("A", "A", "B"))
    keys = [k for k in range(0, 2**32, 2**32 // 300) if slot_for_key(k, 3) == 2]
    assert keys
    for key in keys:
        p = place_in_class(key, classes, {}, **KW)
        assert p.reason == "drained" and {s for s, _ in p.candidates} == {0, 1}
        assert p.numerics_class == "A"


def test_unknown_or_lonely_classes_fall_back_to_pinned():
    key = 777
    home = slot_for_key(key, 2)
    for classes in (ModelClasses((None, None)), ModelClasses(("A", "B"), "mixed")):
        p = place_in_class(key, classes, {home: 100}, **KW)
        assert p.candidates == ((home, 120.0),) and not p.within_class
    nxt = place_in_class(key, ModelClasses((None, None)), {}, **{**KW, "failover": "next_slot"})
    assert nxt.candidates == place(key, 2, "next_slot", 120.0, 5.0).candidates


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 20), min_size=2, max_size=8),
    st.floats(1.0, 3.0),
)
def test_bounded_load_properties(key, loads, c):
    n = len(loads)
    load = dict(enumerate(loads))
    p = place_in_class(key, ModelClasses(("A",) * n), load, **{**KW, "load_bound": c})
    members = [s for s, _ in p.candidates]
    assert sorted(members) == list(range(n))  # every mate, once
    total = sum(loads)
    capacity = max(1, math.ceil(c * (total + 1) / n))  # the documented bound, as written
    under = [s for s in slot_ranking(key, n) if load[s] < capacity]
    if under:  # the first mate under the bound, in the key's own ranking
        assert p.first == under[0]
    else:
        assert load[p.first] == min(loads)


def test_a_slow_slot_gives_its_keys_away_before_its_queue_builds():
    """A slot answering 10x slower than its mate weighs each of its requests as 10: with
    two requests in it, its key goes to the fast mate; by load alone it would stay."""
    key = 777
    home, mate = slot_ranking(key, 2)
    load = {home: 2, mate: 2}
    assert bounded_choice([home, mate], load, 1.25) == home
    slow = {home: 2.0, mate: 0.2}
    assert bounded_choice([home, mate], load, 1.25, slow) == mate
    p = place_in_class(key, ModelClasses(("A", "A")), load, **KW, service_s=slow)
    assert p.first == mate and p.reason == "load" and p.home == home


def test_an_idle_slow_slot_still_takes_its_own_keys():
    """Idle, a key's own slot answers at once whatever its speed: an idle gateway places
    every key on its own slot (and a once-slow slot is measured again)."""
    for key in range(0, 2**32, 2**32 // 31):
        home = slot_for_key(key, 2)
        service = {home: 5.0, 1 - home: 0.01}
        p = place_in_class(key, ModelClasses(("A", "A")), {0: 0, 1: 0}, **KW, service_s=service)
        assert p.first == home and p.reason == "preferred"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 20), min_size=2, max_size=8),
    st.floats(0.001, 10.0),
)
def test_equal_answer_times_are_plain_bounded_load(key, loads, seconds):
    load = dict(enumerate(loads))
    members = slot_ranking(key, len(loads))
    same = {s: seconds for s in members}
    assert bounded_choice(members, load, 1.25, same) == bounded_choice(members, load, 1.25)
    unmeasured = {s: 0.0 for s in members}
    assert bounded_choice(members, load, 1.25, unmeasured) == bounded_choice(members, load, 1.25)


def test_a_slow_mate_keeps_its_free_place_until_the_fast_mates_queue_is_as_deep_as_it_is_slow():
    """Class queue rule (shortest expected delay): slot 0 answers 10x slower than slot 1,
    which holds 4 requests. With one request in it, a waiter is worth 2 answer times on
    slot 0 (20 of slot 1's) only when slot 1 would need 20 of its own for it: 15 waiting,
    4 in flight and 1 for the waiter. Idle, slot 0 takes one at once."""
    slow = {0: 0.1, 1: 0.01}
    assert takes_waiter(0, {0: 0, 1: 4}, 0, slow)  # idle: its answers add to the rate
    assert not takes_waiter(0, {0: 1, 1: 4}, 1, slow)
    assert not takes_waiter(0, {0: 1, 1: 4}, 14, slow)
    assert takes_waiter(0, {0: 1, 1: 4}, 15, slow)
    assert not takes_waiter(0, {0: 2, 1: 4}, 15, slow)  # its third place: 30 > 20
    assert takes_waiter(1, {0: 1, 1: 3}, 0, slow)  # the fast mate always takes one


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=6), st.integers(0, 50), st.data())
def test_counted_by_requests_a_free_place_always_takes_a_class_waiter(inflight, queued, data):
    """``load_weight: count`` (no answer times) or equal times: the rule never keeps a free
    place from a waiter whose mates are at least as full (what the class queue did before)."""
    loads = dict(enumerate(inflight))
    slot = data.draw(st.sampled_from(sorted(loads)))
    if any(loads[s] < loads[slot] for s in loads):
        return  # a mate with fewer in flight would have taken the waiter already
    assert takes_waiter(slot, loads, queued)
    assert takes_waiter(slot, loads, queued, {s: 0.5 for s in loads})
