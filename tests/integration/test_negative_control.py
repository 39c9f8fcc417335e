"""The control: without the gateway's policy vLLM CPU gives other bits for the same input.

The wide (hidden 1024) fp32 classifier, served by plain vLLM with its defaults (batching and
prefix caching on), scores the same input differently depending on what else it ran with,
and on what it ran before. Which of the two shows depends on the CPU (measured):

* AVX-512 hosts: one-token inputs alone take a single-row GEMV path that reduces in another
  order than the batched GEMM (batch variance).
* AVX2-only hosts (AMD EPYC, session 12): oneDNN's fp32 GEMM gives every row the same bits
  at any batch size, so one-token inputs show nothing; but a long input (300-470 tokens)
  seen a second time is scored from its cached prefix and 11 of 24 gave other bits than
  the first time (prefix-cache variance).

So the inputs are one-token strings and long strings the engine has not seen before each
test. Through the gateway (``serialize``: one sequence at a time, prefix caching off) the
same scenario gives identical bits, and they are exactly the engine's first, one-at-a-time
values.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.control_inputs import SHORT, long_inputs

pytestmark = pytest.mark.integration

INPUTS = SHORT + long_inputs(seed=12)
CHECK_INPUTS = SHORT + long_inputs(seed=13)  # fresh to the plain engine for the verifier


@pytest.fixture(scope="module")
def plain_vllm(plain_engine):
    """Plain vLLM (determinism 'off': default max_num_seqs, batching) on the wide model."""
    engine, _ = plain_engine
    engine.wait_ready(600)
    return engine.url


async def _score_each(client: httpx.AsyncClient, url: str, concurrently: bool) -> list[float]:
    async def one(x: str) -> float:
        r = await client.post(
            url + "/classify", json={"model": "rm-large", "input": x, "use_activation": False}
        )
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["probs"][0]

    if concurrently:
        return list(await asyncio.gather(*(one(x) for x in INPUTS)))
    return [await one(x) for x in INPUTS]


async def _score_list(client: httpx.AsyncClient, url: str) -> list[float]:
    r = await client.post(
        url + "/classify", json={"model": "rm-large", "input": INPUTS, "use_activation": False}
    )
    assert r.status_code == 200, r.text
    return [d["probs"][0] for d in r.json()["data"]]


def _differing(a: list[float], b: list[float]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


async def test_batch_variance_without_policy_and_none_through_gateway(plain_vllm, gateway):
    gateway_url, _ = gateway
    async with httpx.AsyncClient(timeout=600) as client:
        plain_alone = await _score_each(client, plain_vllm, concurrently=False)
        plain_concurrent = await _score_each(client, plain_vllm, concurrently=True)
        plain_list = await _score_list(client, plain_vllm)

        gw_alone = await _score_each(client, gateway_url, concurrently=False)
        gw_concurrent = await _score_each(client, gateway_url, concurrently=True)
        gw_list = await _score_list(client, gateway_url)

    # Negative control: the platform shows batch variance without the policy.
    assert _differing(plain_alone, plain_list) > 0
    assert _differing(plain_alone, plain_concurrent) + _differing(plain_alone, plain_list) > 0
    # With the gateway's policy: none, whatever the arrival pattern.
    assert _differing(gw_alone, gw_concurrent) == 0
    assert _differing(gw_alone, gw_list) == 0
    # And the gateway's bits are the engine's own one-at-a-time bits.
    assert gw_alone == plain_alone


def _rmgate_check(url: str, requests_file, *extra: str):
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "check",
            url,
            "--requests",
            str(requests_file),
            "-c",
            "1",
            "-c",
            "64",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_rmgate_check_verdicts(plain_vllm, gateway, tmp_path):
    """The verifier says IDENTICAL for rmgate and DIFFERENT for plain vLLM (its control)."""
    import json as _json

    gateway_url, _ = gateway
    requests_file = tmp_path / "requests.jsonl"
    requests_file.write_text(
        "".join(
            _json.dumps(
                {
                    "path": "/classify",
                    "body": {"model": "rm-large", "input": x, "use_activation": False},
                }
            )
            + "\n"
            for x in CHECK_INPUTS
        )
    )
    good = _rmgate_check(gateway_url, requests_file)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "IDENTICAL" in good.stdout
    bad = _rmgate_check(plain_vllm, requests_file)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "DIFFERENT" in bad.stdout
    against = _rmgate_check(gateway_url, requests_file, "--against", plain_vllm)
    assert against.returncode == 1 and "DIFFERENT" in against.stdout
