"""Groups in /v1/rewards against a fake engine: a group's items on one slot, the same
rewards as the items sent alone, bad groups refused."""

from __future__ import annotations

import pytest

from tests.unit import test_rewards

#: The rewards tests' gateway over a judge transport that records each slot it is sent to.
setup = test_rewards.setup


def items(group: str | None, n: int = 16) -> list[dict]:
    out = [{"prompt": "What is 12+30?", "response": f"It is {40 + i}."} for i in range(n)]
    return [{**it, "group": group} for it in out] if group is not None else out


@pytest.mark.parametrize("model", ["rm", "judge"])
async def test_a_groups_items_go_to_one_slot_with_the_rewards_of_items_alone(setup, model):
    client, transport = setup
    alone = await client.post("/v1/rewards", json={"model": model, "items": items(None)})
    assert alone.status_code == 200, alone.text
    # the control: the same items alone spread over both slots
    assert {slot for _, slot, _, _ in transport.sent} == {0, 1}
    transport.sent.clear()
    grouped = await client.post("/v1/rewards", json={"model": model, "items": items("g1")})
    assert grouped.status_code == 200, grouped.text
    assert len({slot for _, slot, _, _ in transport.sent}) == 1
    assert grouped.json()["rewards"] == alone.json()["rewards"]
    assert all(d["group"] == "g1" for d in grouped.json()["details"])
    assert all("group" not in d for d in alone.json()["details"])


async def test_groups_spread_over_slots_and_a_group_always_lands_alike(setup):
    client, transport = setup
    homes = {}
    for g in range(12):
        transport.sent.clear()
        r = await client.post("/v1/rewards", json={"model": "rm", "items": items(f"q{g}", 4)})
        assert r.status_code == 200, r.text
        slots = {slot for _, slot, _, _ in transport.sent}
        assert len(slots) == 1
        homes[g] = slots.pop()
    assert set(homes.values()) == {0, 1}
    for g in (3, 5):  # again: the same slot
        transport.sent.clear()
        mixed = items(f"q{g}", 3)
        r = await client.post("/v1/rewards", json={"model": "rm", "items": mixed})
        assert {slot for _, slot, _, _ in transport.sent} == {homes[g]}


@pytest.mark.parametrize("group", ["", 7, ["a"], "x" * 257])
async def test_a_bad_group_is_a_422_naming_the_field(setup, group):
    client, _ = setup
    r = await client.post(
        "/v1/rewards",
        json={"model": "rm", "items": [{"prompt": "p", "response": "r", "group": group}]},
    )
    assert r.status_code == 422, r.text
    assert "group" in r.text
