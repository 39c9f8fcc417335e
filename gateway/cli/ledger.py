"""``rmgate ledger``: stats, export, replay, audit and invalidate over a gateway's reward
ledger.

Which ledger: ``--db`` (a SQLite file, or a ``postgresql://`` DSN), else the ledger a
config file names (``--config``), else the default SQLite file (``$RMGATE_STATE_DIR``,
``$XDG_STATE_HOME/rmgate``, ``~/.local/state/rmgate``).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

ledger_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="The reward ledger: stats, export, replay, audit, invalidate.",
)

DB = typer.Option(
    None,
    "--db",
    help="A SQLite file or a postgresql:// DSN (default: the "
    "config's ledger, else the default SQLite file).",
)
CONFIG = typer.Option(
    None,
    "--config",
    exists=True,
    dir_okay=False,
    help="A Serve config file whose gateway.ledger to open.",
)


def open_ledger_store(db: str | None, config: Path | None) -> Any:
    """The store ``--db``/``--config`` name (see the module docstring)."""
    from gateway.core.config.settings import AppConfig, LedgerSettings
    from gateway.ledger.ledger import open_store

    if db:
        if db.startswith(("postgresql://", "postgres://")) or "host=" in db:
            settings = LedgerSettings(backend="postgres", dsn=db)
        else:
            path = Path(db).expanduser()
            if not path.exists():
                typer.echo(f"rmgate ledger: {path} does not exist", err=True)
                raise typer.Exit(2)
            from gateway.ledger.sqlite_store import SqliteLedger

            return SqliteLedger(path)
    elif config is not None:
        from gateway.cli.config_file import load_serve_config

        args = load_serve_config(config)["applications"][0]["args"]
        settings = AppConfig.model_validate(args).gateway.ledger
    else:
        settings = LedgerSettings()
    if settings.backend == "sqlite" and not settings.sqlite_path().exists():
        typer.echo(f"rmgate ledger: no ledger at {settings.sqlite_path()}", err=True)
        raise typer.Exit(2)
    return open_store(settings)


def parse_since(since: str | None) -> float | None:
    """Unix seconds, or an ISO date/time (UTC unless it says)."""
    if since is None:
        return None
    try:
        return float(since)
    except ValueError:
        when = datetime.fromisoformat(since)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()


@ledger_app.command()
def stats(
    db: str | None = DB,
    config: Path | None = CONFIG,
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
) -> None:
    """Rows and the cache's hit rate, per model and numerics class."""
    store = open_ledger_store(db, config)
    try:
        entries = store.stats()
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    typer.echo(
        f"{'model':<16}{'class':<14}{'rows':>9}{'hit':>9}{'shared':>9}{'miss':>9}{'hit rate':>10}"
    )
    for e in entries:
        rate = "-" if e["hit_rate"] is None else f"{e['hit_rate']:.1%}"
        typer.echo(
            f"{e['model']:<16}{e['numerics_class']:<14}{e['rows']:>9}"
            f"{e.get('hit', 0):>9}{e.get('shared', 0):>9}{e.get('miss', 0):>9}"
            f"{rate:>10}"
        )


@ledger_app.command()
def export(
    out: Path = typer.Argument(..., help="The file to write."),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl or parquet."),
    since: str | None = typer.Option(
        None, help="Rows recorded at or after this (Unix seconds or ISO time)."
    ),
    model: str | None = typer.Option(None, help="Only this model's rows."),
    db: str | None = DB,
    config: Path | None = CONFIG,
) -> None:
    """Write the ledger's rows (bodies and answers as UTF-8 text) to JSON lines or
    Parquet (pyarrow, in rmgate's ledger extra)."""
    if fmt not in ("jsonl", "parquet"):
        typer.echo("rmgate ledger export: --format is jsonl or parquet", err=True)
        raise typer.Exit(2)
    store = open_ledger_store(db, config)
    try:
        rows = (r.readable().as_dict() for r in store.rows(model=model, since=parse_since(since)))
        if fmt == "jsonl":
            n = 0
            with open(out, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                typer.echo(
                    "rmgate ledger export: parquet needs pyarrow: pip install 'rmgate[ledger]'",
                    err=True,
                )
                raise typer.Exit(2) from None
            table = pa.Table.from_pylist(list(rows))
            pq.write_table(table, out)
            n = table.num_rows
    finally:
        store.close()
    typer.echo(f"{n} rows -> {out}")


@ledger_app.command()
def replay(
    url: str = typer.Argument(
        ...,
        help="The deployment to re-send to, e.g. "
        "http://127.0.0.1:8000 (a gateway or a vLLM server).",
    ),
    model: str | None = typer.Option(None, help="Only this model's rows."),
    since: str | None = typer.Option(None, help="Rows recorded at or after this."),
    sample: int | None = typer.Option(
        None, min=1, help="At most this many rows, drawn reproducibly."
    ),
    concurrency: int = typer.Option(16, "--concurrency", "-c", min=1),
    plot_path: Path | None = typer.Option(
        None, "--plot", help="Also write the histogram of |diff| as a PNG."
    ),
    groups: bool = typer.Option(
        False,
        "--groups",
        help="Replay the group scorers' runs (pairwise, listwise): every answer each "
        "recorded group's rewards were read from, and say which groups could change.",
    ),
    program: str | None = typer.Option(None, help="With --groups: only this program's groups."),
    api_key: str | None = typer.Option(None, envvar="RMGATE_API_KEY"),
    db: str | None = DB,
    config: Path | None = CONFIG,
) -> None:
    """Re-send recorded requests to URL and report which rewards changed, by how much.
    Exit code 0 only when every answer is bitwise the recorded one."""
    import asyncio

    from rich.progress import Progress

    from gateway.client import ledger_replay as lr
    from gateway.core.scoring.code_tests import CODE_ENDPOINT

    store = open_ledger_store(db, config)
    group_rows: list = []
    missing: set[str] = set()
    try:
        if groups:
            group_rows = store.group_rows(program=program)
            found = {
                r: store.get(r, include_invalidated=True) for r in lr.group_receipts(group_rows)
            }
            missing = {r for r, row in found.items() if row is None}
            rows = lr.pick((row for row in found.values() if row is not None), sample)
        else:
            # engine answers only: a code_tests rule's recorded results are no engine request
            rows = lr.pick(
                (
                    row
                    for row in store.rows(model=model, since=parse_since(since))
                    if row.endpoint != CODE_ENDPOINT
                ),
                sample,
            )
    finally:
        store.close()
    if not rows:
        typer.echo("rmgate ledger replay: no recorded rows match", err=True)
        raise typer.Exit(2)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("replaying", total=len(rows))

        class Tick:
            def update(self, n: int) -> None:
                bar.advance(task, n)

        report = asyncio.run(lr.replay_rows(url.rstrip("/"), rows, concurrency, headers, Tick()))
    v = report.verdict
    typer.echo(
        f"replayed {v.requests} recorded rewards to {url}: {v.identical} identical, "
        f"{v.differing} changed, {v.failed} failed"
        + (
            f", {report.without_body} without a recorded body (not replayable)"
            if report.without_body
            else ""
        )
    )
    if groups:
        changed = lr.changed_groups(group_rows, report, missing)
        typer.echo(
            f"groups: {len(group_rows)} replayed, {len(group_rows) - len(changed)} identical, "
            f"{len(changed)} changed" + (f" ({len(missing)} answers missing)" if missing else "")
        )
        for identity in changed:
            typer.echo(f"  changed group row {identity}")
    if v.differing:
        typer.echo(f"max |diff| {v.max_abs_diff:.3g}")
        typer.echo(lr.format_histogram(report.diffs))
    if plot_path is not None:
        lr.plot(report.diffs, str(plot_path))
        typer.echo(f"histogram -> {plot_path}")
    raise typer.Exit(0 if report.ok and not missing else 1)


@ledger_app.command()
def audit(
    url: str = typer.Argument(..., help="The running gateway, e.g. http://127.0.0.1:8000."),
    model: str | None = typer.Option(None, help="Only this model's rows."),
    since: str | None = typer.Option(None, help="Rows recorded at or after this."),
    sample: int = typer.Option(100, min=1, help="At most this many rows, drawn reproducibly."),
    seed: int = typer.Option(0, help="Which rows the sample draws."),
    admin_key: str | None = typer.Option(
        None, envvar="RMGATE_ADMIN_API_KEY", help="An admin key (when the gateway has API keys)."
    ),
) -> None:
    """Audit recorded rewards now on the live deployment: each is re-answered on another
    slot of its numerics class with the cache off and compared bitwise; a slot the evidence
    names is drained, as the continuous audit does (``POST /v1/audit``). Exit code 0 only
    when every re-answer is the recorded one."""
    import httpx

    body = {"model": model, "since": parse_since(since), "sample": sample, "seed": seed}
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        resp = httpx.post(url.rstrip("/") + "/v1/audit", json=body, headers=headers, timeout=3600)
    except httpx.HTTPError as exc:
        typer.echo(f"rmgate ledger audit: {url}: {exc}", err=True)
        raise typer.Exit(2) from None
    if resp.status_code != 200:
        typer.echo(f"rmgate ledger audit: {resp.status_code} {resp.text}", err=True)
        raise typer.Exit(2)
    got = resp.json()
    skipped = ", ".join(f"{n} {why}" for why, n in got.get("skipped", {}).items())
    typer.echo(
        f"audited {got['audited']} recorded rewards on class mates: {got['same']} same, "
        f"{got['different']} different, {got['failed']} failed"
        + (f" (skipped: {skipped})" if skipped else "")
    )
    for rec in got["records"]:
        if rec["outcome"] != "same":
            named = f"; slot {rec['blamed_slot']} drained" if rec["blamed_slot"] is not None else ""
            typer.echo(
                f"  {rec['outcome']}: {rec['model']} {rec['receipt']} (recorded by slot "
                f"{rec['recorded_slot']}, re-answered by {rec['audit_slot']}): "
                f"{rec['detail']}{named}"
            )
    raise typer.Exit(0 if got["different"] == 0 and got["failed"] == 0 else 1)


@ledger_app.command()
def invalidate(
    model: str = typer.Option(
        ..., "--model", help="The model whose rows stop being answered from the ledger."
    ),
    numerics_class: str | None = typer.Option(None, "--class", help="Only this numerics class."),
    db: str | None = DB,
    config: Path | None = CONFIG,
) -> None:
    """Stop cache hits for a model's rows (of one class). Rows stay for audit; running
    gateways forget them from memory within seconds; the next answer is recorded anew."""
    store = open_ledger_store(db, config)
    try:
        n = store.invalidate(model, numerics_class)
    finally:
        store.close()
    typer.echo(
        f"{n} rows of {model}{' class ' + numerics_class if numerics_class else ''} invalidated"
    )
