"""The verifier's comparison logic (``rmgate check``)."""

import json
import math

import pytest

from gateway.client.check import (
    Result,
    compare,
    essence,
    format_table,
    generated_calls,
    load_calls,
    max_abs_diff,
)


def r(ess, status=200, slot="0", seed=None, cls=None):
    return Result(status, ess, slot, seed, None, cls)


def test_compare_counts_identical_differing_failed():
    ref = {0: r([0.5]), 1: r([1.0]), 2: r([2.0])}
    run = {0: r([0.5]), 1: r([1.0 + 1e-7]), 2: r("boom", status=503)}
    v = compare("x", ref, run)
    assert (v.identical, v.differing, v.failed) == (1, 1, 1)
    assert v.max_abs_diff == pytest.approx(1e-7) and not v.ok
    assert "DIFFERENT" in format_table([v])
    assert "IDENTICAL" in format_table([compare("y", ref, ref)])


def test_same_bits_from_another_slot_of_the_class_are_identical():
    """Class placement may move a key to a class mate: the slot is information only."""
    v = compare("x", {0: r([1.0], slot="0", cls="c1")}, {0: r([1.0], slot="1", cls="c1")})
    assert (v.identical, v.differing) == (1, 0) and v.ok and v.slots == ["1"]
    assert "IDENTICAL" in format_table([v])


def test_another_numerics_class_or_seed_counts_as_differing_even_with_equal_bits():
    other_class = compare("x", {0: r([1.0], cls="c1")}, {0: r([1.0], cls="c2")})
    assert other_class.differing == 1 and other_class.other_class == 1 and not other_class.ok
    assert "DIFFERENT" in format_table([other_class])
    assert compare("x", {0: r([1.0], seed="7")}, {0: r([1.0], seed="8")}).differing == 1
    # a side that names no class (plain vLLM, an old gateway) is compared on the bits alone
    assert compare("x", {0: r([1.0], cls="c1")}, {0: r([1.0])}).ok
    assert compare("x", {0: r([1.0], cls="c1")}, {0: r([2.0])}).differing == 1


def test_max_abs_diff_over_nested_values():
    assert max_abs_diff([(0, [0.5, 1.0])], [(0, [0.5, 1.25])]) == 0.25
    assert math.isinf(max_abs_diff([1.0], [1.0, 2.0]))


def test_essence_ignores_ids_and_times():
    a = {"id": "1", "created": 1, "data": [{"index": 0, "probs": [0.3]}]}
    b = {"id": "2", "created": 2, "data": [{"index": 0, "probs": [0.3]}]}
    assert essence("/classify", a) == essence("/classify", b)
    # the shared definition (gateway.core.api.answers): rewards and what they were computed from
    same = {"rewards": [1.0], "details": [{"index": 0, "slot": "0", "judge_text": "1"}]}
    moved = {"rewards": [1.0], "details": [{"index": 0, "slot": "1", "judge_text": "1"}]}
    other = {"rewards": [1.0], "details": [{"index": 0, "slot": "0", "judge_text": "1."}]}
    assert essence("/v1/rewards", same) == essence("/v1/rewards", moved)
    assert essence("/v1/rewards", same) != essence("/v1/rewards", other)


def test_essence_is_bitwise_and_feeds_max_abs_diff():
    def probs(v):
        return {"data": [{"index": 0, "probs": [0.5, v]}]}

    assert essence("/classify", probs(0.0)) != essence("/classify", probs(-0.0))  # == as floats
    v = compare(
        "x",
        {0: r(essence("/classify", probs(0.25)))},
        {0: r(essence("/classify", probs(math.nextafter(0.25, 1))))},
    )
    assert v.differing == 1 and 0 < v.max_abs_diff < 1e-15
    chat = {
        "choices": [
            {
                "index": 0,
                "message": {"content": "a"},
                "finish_reason": "length",
                "token_ids": [1, 2],
            }
        ]
    }
    other = {
        "choices": [
            {
                "index": 0,
                "message": {"content": "a"},
                "finish_reason": "length",
                "token_ids": [1, 3],
            }
        ]
    }
    assert essence("/v1/chat/completions", chat) != essence("/v1/chat/completions", other)


def test_load_calls_and_generation(tmp_path):
    f = tmp_path / "req.jsonl"
    f.write_text(json.dumps({"path": "/classify", "body": {"input": "a"}}) + "\n\n")
    assert load_calls(f)[0].body == {"input": "a"}
    f.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError):
        load_calls(f)
    calls = generated_calls(
        [{"id": "j", "kind": "generative"}, {"id": "r", "kind": "discriminative"}], 4
    )
    assert [c.body["model"] for c in calls] == ["j"] * 4 + ["r"] * 4
