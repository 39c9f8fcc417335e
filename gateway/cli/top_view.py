"""``rmgate top``'s frame: what was fetched from a gateway, turned into rich tables.

Pure (no HTTP, no clock, no terminal): everything the frame shows comes in a ``View``, so
the same data always draws the same frame, which is what the snapshot test compares and
what ``--once`` prints. A part the gateway did not answer is drawn as an error line and a
``-`` where its numbers would be; the rest of the frame is drawn as usual.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gateway.cli.top_metrics import Rates, Scrape, cache_hit

DASH = "-"


@dataclass(frozen=True)
class View:
    """One frame's data. ``models``/``programs``: ``/v1/models``' ``data`` and ``programs``
    (``None``: it failed); ``audit``: ``/v1/audit`` (``None``: off the frame, ``audit_note``
    says why); ``rates``: between this scrape and the one before (``None`` on the first);
    ``now``: wall-clock seconds, for the ages of audit events; ``clock``: the time shown in
    the header (the live view's; ``--once`` shows none)."""

    url: str
    interval: float
    now: float
    models: list[dict[str, Any]] | None
    programs: list[dict[str, Any]] = field(default_factory=list)
    scrape: Scrape | None = None
    rates: Rates | None = None
    audit: dict[str, Any] | None = None
    audit_note: str | None = None
    errors: list[str] = field(default_factory=list)
    clock: str | None = None


def _rate(values: dict[str, float] | None, key: str) -> str:
    return DASH if values is None else f"{values.get(key, 0.0):.1f}"


def _share(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.0f}%"


def _count(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}"


def _ago(now: float, at: Any) -> str:
    return f"{max(0.0, now - float(at)):.0f} s ago" if isinstance(at, int | float) else "?"


#: Columns of numbers: right-aligned.
NUMBERS = {"req/s", "err/s", "cache hit", "hit total", "in flight", "queued"}
NUMBERS |= {"same", "different", "failed"}
#: A state's color in the live view (plain text has none): what needs a look stands out.
STATE_STYLES = {"awake": "green", "asleep": "yellow", "sleeping": "yellow", "waking": "yellow"}
STATE_STYLES |= {"scaling": "cyan", "mixed": "yellow"}
STATE_STYLES |= {"kept_out": "bold red", "unavailable": "bold red", "error": "bold red"}


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in NUMBERS else "left")
    return table


def _state(text: str) -> Text:
    return Text(text, style=STATE_STYLES.get(text.split(" ")[0].rstrip(","), ""))


def _autoscaling(card: dict[str, Any]) -> str:
    auto = card.get("autoscaling")
    if not auto:
        return DASH
    out = f"{auto.get('min_slots', '?')}..{auto.get('max_slots', '?')}"
    return f"{out} scaling" if auto.get("scaling") else out


def _classes(card: dict[str, Any]) -> str:
    """The model's numerics classes (which slot is in which: the slots table)."""
    return " ".join(card.get("classes") or {}) or DASH


def _cache_cells(view: View, model: str) -> tuple[str, str]:
    """(the interval's cache hit share, since the replica started)."""
    live = view.rates.cache_hit.get(model) if view.rates else None
    total = cache_hit(view.scrape.cache, model) if view.scrape else None
    return _share(live), _share(total)


def _models_table(view: View, models: list[dict[str, Any]]) -> Table:
    rates = view.rates
    table = _table(
        "model",
        "kind",
        "state",
        "classes",
        "awake",
        "req/s",
        "err/s",
        "cache hit",
        "hit total",
        "autoscaling",
        title="models",
    )
    for card in models:
        name = str(card.get("id"))
        states = card.get("slot_states") or []
        ready = sum(1 for s in states if s.get("state") == "awake")
        table.add_row(
            name,
            str(card.get("kind", DASH)),
            _state(str(card.get("state", DASH))),
            _classes(card),
            f"{ready}/{card.get('slots', len(states))}",
            _rate(rates.requests if rates else None, name),
            _rate(rates.errors if rates else None, name),
            *_cache_cells(view, name),
            _autoscaling(card),
        )
    for program in view.programs:
        name = str(program.get("name"))
        table.add_row(
            name,
            "program",
            DASH,
            DASH,
            DASH,
            _rate(rates.requests if rates else None, name),
            _rate(rates.errors if rates else None, name),
            *_cache_cells(view, name),
            DASH,
        )
    return table


def _slot_state(card: dict[str, Any], slot: int, state: dict[str, Any]) -> str:
    text = str(state.get("state", "?"))
    if state.get("level") is not None and text in ("asleep", "sleeping"):
        text += f" (level {state['level']})"
    if state.get("kept_out"):
        text += f" ({state['kept_out']})"
    drained = (card.get("drained") or {}).get(str(slot))
    if drained:
        text += f", drained: {drained}"
    health = card.get("health") or []
    if slot < len(health) and health[slot] != "healthy":
        text += f", {health[slot]}"
    return text


def _slots_table(view: View, models: list[dict[str, Any]]) -> Table:
    table = _table("slot", "class", "state", "in flight", "queued", title="slots")
    scrape = view.scrape
    for card in models:
        name = str(card.get("id"))
        states = card.get("slot_states") or []
        classes = card.get("numerics_classes") or []
        for i in range(max(int(card.get("slots", 0)), len(states))):
            state = states[i] if i < len(states) else {}
            slot = int(state.get("slot", i))
            table.add_row(
                f"{name}-{slot}",
                str(classes[slot]) if slot < len(classes) and classes[slot] else "?",
                _state(_slot_state(card, slot, state)),
                _count(scrape.inflight.get((name, slot)) if scrape else None),
                _count(scrape.queued.get((name, slot)) if scrape else None),
            )
    return table


def _totals(view: View) -> Text:
    rates, scrape = view.rates, view.scrape
    if rates is None:
        traffic = "requests: - (rates from the next scrape)"
    else:
        traffic = (
            f"requests: {sum(rates.requests.values()):.1f}/s, "
            f"errors: {sum(rates.errors.values()):.1f}/s over {rates.seconds:.1f} s"
        )
    if scrape is None:
        ledger = "ledger: -"
    else:
        per_s = rates.ledger_written if rates else None
        written = DASH if per_s is None else f"{per_s:.1f}"
        ledger = (
            f"ledger: {_count(scrape.ledger_buffered)} buffered, "
            f"{_count(scrape.ledger_dropped)} dropped, {written} rows/s written"
        )
    dropped = bool(scrape and scrape.ledger_dropped)
    return Text.assemble(traffic + "; ", (ledger, "bold red" if dropped else ""))


def _audit(view: View, out: list[RenderableType]) -> None:
    audit = view.audit
    if audit is None:
        out.append(Text(f"audit: {view.audit_note or 'unavailable'}"))
        return
    if not audit.get("enabled"):
        out.append(Text("audit: off"))
        return
    out.append(
        Text(
            f"audit: on, sample {audit.get('sample', '?')}, at most "
            f"{audit.get('max_per_minute', '?')}/min, {audit.get('queued', 0)} queued"
        )
    )
    classes = audit.get("classes") or []
    if classes:
        table = _table("model", "class", "same", "different", "failed", "suspect")
        for c in classes:
            table.add_row(
                str(c.get("model")),
                str(c.get("numerics_class")),
                str(c.get("same", 0)),
                str(c.get("different", 0)),
                str(c.get("failed", 0)),
                Text("SUSPECT", style="bold red") if c.get("suspect") else Text("no"),
            )
        out.append(table)
    for d in audit.get("drained") or []:
        out.append(
            Text(
                f"drained by the audit: {d.get('model')}-{d.get('slot')} (class "
                f"{d.get('numerics_class')}, receipt {d.get('receipt')}, "
                f"{_ago(view.now, d.get('at'))})",
                style="red",
            )
        )
    last = audit.get("last_mismatch")
    if last:
        out.append(
            Text(
                f"last mismatch: {last.get('model')} class {last.get('numerics_class')}: "
                f"recorded on slot {last.get('recorded_slot')}, slot "
                f"{last.get('audit_slot')} answered {last.get('verdict')} (receipt "
                f"{last.get('receipt')}, {_ago(view.now, last.get('at'))})",
                style="red",
            )
        )


def render(view: View) -> Group:
    """The frame: a header, error lines, totals, the models, their slots, the audit."""
    header = f"rmgate top  {view.url}  every {view.interval:g} s"
    out: list[RenderableType] = [
        Text(header + (f"  {view.clock}" if view.clock else ""), style="bold")
    ]
    out += [Text(f"error: {e}", style="bold red") for e in view.errors]
    out.append(_totals(view))
    if view.models is not None:
        out.append(_models_table(view, view.models))
        out.append(_slots_table(view, view.models))
    _audit(view, out)
    return Group(*out)


def to_text(frame: RenderableType, width: int = 120) -> str:
    """The frame as plain text (no color, no trailing spaces): ``--once`` and the tests."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width, color_system=None, highlight=False, force_terminal=False
    )
    console.print(frame)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
