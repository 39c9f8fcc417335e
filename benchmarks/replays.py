"""What the benchmarks' replays count: answers that differ from the first run's."""

from __future__ import annotations

from typing import Any


def differing(runs: list[dict[int, str]]) -> dict[str, Any]:
    """Per later run, the answers that differ from run 1's (by call index), and the calls
    whose answer differed in any later run."""
    first = runs[0]
    return {
        "differing_per_run": [sum(r[i] != first[i] for i in first) for r in runs[1:]],
        "any_differing": sum(any(r[i] != first[i] for r in runs[1:]) for i in first),
    }
