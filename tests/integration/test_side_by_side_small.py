"""The side-by-side determinism check, small, in the default suite: the same requests
replayed three times, each in its own shuffled order at concurrency 32, through a
least-loaded proxy over a plain engine (``determinism: off``: the control) and through rmgate,
on Serve's port and on the ingress's own port (``--direct-port``).

The full run (``benchmarks/side_by_side.py``, 1,000 requests) is the source of README's first
row; this is its determinism part on the session's gateway, with inputs that show the
platform's variance on either kind of host (``tests/integration/control_inputs.py``). The
control must differ, or the check proves nothing: without it, rmgate's 0 would also be what
sequential identical requests give with no policy at all.
"""

from __future__ import annotations

import pytest

from benchmarks.side_by_side import replay
from tests.integration.control_inputs import SHORT, long_inputs

pytestmark = pytest.mark.integration


def _calls(inputs: list[str]) -> list[tuple[str, dict]]:
    return [
        ("/classify", {"model": "rm-large", "input": x, "use_activation": False}) for x in inputs
    ]


async def test_replays_differ_through_least_loaded_and_never_through_rmgate(
    gateway, gateway_direct_url, least_loaded
):
    url, _ = gateway
    # inputs no other test sends (the prefix cache of the plain engine has not seen them)
    calls = _calls(SHORT[:40] + long_inputs(seed=21, n=16))
    control = await replay([least_loaded], calls)
    via_serve = await replay([url], calls)
    direct = await replay([gateway_direct_url], calls)
    print(
        {
            k: {f: v for f, v in r.items() if f != "answers"}
            for k, r in {
                "least_loaded": control,
                "serve_port": via_serve,
                "direct_port": direct,
            }.items()
        }
    )
    assert control["any_differing"] > 0, control  # the platform's variance shows
    assert via_serve["any_differing"] == 0, via_serve
    assert direct["any_differing"] == 0, direct
    assert direct["answers"] == via_serve["answers"]  # either port: the same bits
