"""Canonicalization, keys and seeds: same request -> same key, whatever the JSON spelling."""

import json
import subprocess
import sys

import pytest

from gateway.core.api.results import key_hex
from gateway.core.routing.hashing import slot_for_key
from gateway.core.routing.keys import IGNORED_FIELDS, canonical_json, derive_seed, request_key

BODY = {
    "model": "judge",
    "messages": [{"role": "user", "content": "Is 2+3=5? ✓ ü"}],
    "temperature": 1.0,
    "max_tokens": 8,
}

# Checked in: a change here means every deployed key moved. Do not update casually.
FIXED_TABLE = [
    ("/v1/chat/completions", BODY, "28802b1f", 1, 1, 1, 6),
    ("/classify", {"model": "rm", "input": "2+3=5"}, "88b1ac60", 1, 2, 3, 6),
    (
        "/classify",
        {"model": "rm", "input": "2+3=6", "use_activation": False},
        "a1eee66c",
        1,
        1,
        3,
        4,
    ),
    ("/v1/completions", {"model": "judge", "prompt": "hi", "seed": 7}, "4cc9ad91", 0, 0, 0, 5),
]


def _reparse(raw: str) -> dict:
    return json.loads(raw)


def test_json_spellings_give_one_key():
    compact = json.dumps(BODY, separators=(",", ":"), ensure_ascii=False)
    aiohttp_style = json.dumps(BODY)  # ", " / ": " separators and \u escapes
    reordered = json.dumps(dict(reversed(list(BODY.items()))), indent=4)
    keys = {
        request_key("/v1/chat/completions", _reparse(s))
        for s in (compact, aiohttp_style, reordered)
    }
    assert len(keys) == 1


def test_canonical_json_is_compact_sorted_utf8():
    assert canonical_json({"b": 1, "a": "ü"}) == '{"a":"ü","b":1}'.encode()


@pytest.mark.parametrize("field", sorted(IGNORED_FIELDS))
def test_ignored_fields_do_not_change_the_key(field):
    assert request_key("/v1/chat/completions", {**BODY, field: "x"}) == request_key(
        "/v1/chat/completions", BODY
    )


@pytest.mark.parametrize(
    "change", [{"temperature": 0.5}, {"model": "other"}, {"seed": 1}, {"max_tokens": 9}]
)
def test_fields_that_matter_change_the_key(change):
    assert request_key("/v1/chat/completions", {**BODY, **change}) != request_key(
        "/v1/chat/completions", BODY
    )


def test_endpoint_is_part_of_the_key():
    assert request_key("/classify", {"input": "a"}) != request_key("/pooling", {"input": "a"})


def test_nan_is_refused():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def _table_rows():
    rows = []
    for endpoint, body, *_ in FIXED_TABLE:
        key = request_key(endpoint, body)
        rows.append(
            [
                key_hex(key),
                slot_for_key(key, 2),
                slot_for_key(key, 3),
                slot_for_key(key, 4),
                slot_for_key(key, 8),
            ]
        )
    return rows


def test_fixed_table_of_keys_and_slots():
    assert _table_rows() == [list(row[2:]) for row in FIXED_TABLE]


def test_keys_and_slots_are_stable_across_processes():
    """Another interpreter (another hash salt) computes the same table."""
    code = "import json, tests.unit.test_keys as t; print(json.dumps(t._table_rows()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=".",
    )
    assert json.loads(out.stdout) == _table_rows()


def test_seed_derivation_is_pure_and_spread():
    seeds = [derive_seed(k) for k in range(10_000)]
    assert seeds == [derive_seed(k) for k in range(10_000)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) > 9_990
    assert derive_seed(5, base=0) != derive_seed(5, base=1)
