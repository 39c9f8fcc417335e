"""``rmgate ledger replay``: re-send recorded requests to a deployment and say which rewards
changed, by how much.

After a vLLM upgrade, on other hardware, with another build of the model: each recorded
canonical engine body is sent again (``x-rmgate-cache: off``, so the deployment computes
it) and its answer compared bitwise with the recorded one, by the same definition every
check here uses (``gateway.core.api.answers``). The report counts identical, changed and failed
answers, the largest |diff|, and a histogram of the changes' magnitudes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.client.check import Call, Result, RunVerdict, compare, essence, max_abs_diff
from gateway.client.check import replay as send_all
from gateway.core.ledger_policy.row import GroupRow, LedgerRow

#: Histogram bins of |diff| (upper bounds), the first for "changed in bits, not in value".
BINS: tuple[tuple[str, float], ...] = (
    ("0 (other bits)", 0.0),
    ("<= 1e-9", 1e-9),
    ("<= 1e-6", 1e-6),
    ("<= 1e-3", 1e-3),
    ("<= 1e-1", 1e-1),
    ("> 1e-1", math.inf),
)


@dataclass
class ReplayReport:
    verdict: RunVerdict
    #: |diff| of each changed answer (inf: not comparable as numbers, e.g. another text).
    diffs: list[float] = field(default_factory=list)
    #: Rows recorded without their body (``keep_bodies: false``): not replayable.
    without_body: int = 0
    #: Receipts of the rows whose answer changed or failed.
    changed: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return self.verdict.ok


def pick(rows: Iterable[LedgerRow], sample: int | None, seed: int = 0) -> list[LedgerRow]:
    """``sample`` rows drawn reproducibly (seeded), else all, in recorded order."""
    chosen = list(rows)
    if sample is not None and sample < len(chosen):
        keep = set(random.Random(seed).sample(range(len(chosen)), sample))
        chosen = [r for i, r in enumerate(chosen) if i in keep]
    return chosen


async def replay_rows(
    url: str,
    rows: list[LedgerRow],
    concurrency: int = 16,
    headers: dict[str, str] | None = None,
    progress: Any = None,
    timeout_s: float = 600,
) -> ReplayReport:
    """Send every row with a body to ``url`` and compare with what was recorded."""
    usable = [r for r in rows if r.body is not None]
    calls = [Call(r.endpoint, json.loads(r.body or b"{}")) for r in usable]
    reference = {
        i: Result(200, essence(r.endpoint, json.loads(r.answer)), str(r.slot), None, None)
        for i, r in enumerate(usable)
    }
    run = await send_all(
        url, calls, list(range(len(calls))), concurrency, timeout_s, progress, headers
    )
    for got in run.values():  # the verdict compares bits (and seeds, which a body fixes)
        got.seed = None
        got.numerics_class = None
    verdict = compare(f"replay ({len(calls)})", reference, run)
    diffs = [
        max_abs_diff(reference[i].essence, run[i].essence)
        for i in reference
        if run[i].status == 200 and run[i].essence != reference[i].essence
    ]
    changed = {
        usable[i].identity
        for i in reference
        if run[i].status != 200 or run[i].essence != reference[i].essence
    }
    return ReplayReport(verdict, diffs, len(rows) - len(usable), changed)


def group_receipts(groups: Iterable[GroupRow]) -> list[str]:
    """Every receipt the group rows name, each once, in order."""
    seen: dict[str, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group.receipts()))
    return list(seen)


def changed_groups(
    groups: Iterable[GroupRow], report: ReplayReport, missing: set[str]
) -> list[str]:
    """The group rows (identities) whose rewards may differ now: one of their answers
    changed, failed, or is not in the ledger any more (a group's rewards are a pure
    function of its answers: all identical, the group's rewards are)."""
    bad = report.changed | missing
    return [g.identity for g in groups if bad.intersection(g.receipts())]


def histogram(diffs: list[float]) -> list[tuple[str, int]]:
    counts = [0] * len(BINS)
    for d in diffs:
        counts[next(i for i, (_, top) in enumerate(BINS) if d <= top)] += 1
    return [(label, n) for (label, _), n in zip(BINS, counts)]


def format_histogram(diffs: list[float], width: int = 40) -> str:
    rows = histogram(diffs)
    top = max((n for _, n in rows), default=0) or 1
    return "\n".join(
        f"  |diff| {label:<15}{n:>7}  {'#' * math.ceil(width * n / top) if n else ''}"
        for label, n in rows
    )


def plot(diffs: list[float], path: str) -> None:
    """The histogram as a PNG (matplotlib, installed with rmgate's dev extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = histogram(diffs)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([label for label, _ in rows], [n for _, n in rows], color="#c0392b")
    ax.set_ylabel("changed rewards")
    ax.set_title(f"rmgate ledger replay: {len(diffs)} changed")
    fig.autofmt_xdate(rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
