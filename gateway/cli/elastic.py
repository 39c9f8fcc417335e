"""``rmgate sleep``, ``rmgate wake`` and ``rmgate status``: a running gateway's models,
asleep or awake, and what its audit found, over its HTTP API (``/sleep``, ``/wake_up``,
``/v1/models``, ``/v1/audit``)."""

from __future__ import annotations

import json

import httpx
import typer

URL = typer.Argument("http://127.0.0.1:8000", help="The gateway.")
MODEL = typer.Option(None, "--model", "-m", help="One model (default: every model).")
ADMIN_KEY = typer.Option(
    None, envvar="RMGATE_ADMIN_API_KEY", help="An admin key (when the gateway has API keys)."
)
API_KEY = typer.Option(
    None, envvar="RMGATE_API_KEY", help="An API key (when the gateway has some)."
)


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _answer(resp: httpx.Response) -> dict:
    if resp.status_code != 200:
        typer.echo(f"{resp.request.url.path}: {resp.status_code} {resp.text}", err=True)
        raise typer.Exit(1)
    return resp.json()


def _print_slots(answer: dict) -> None:
    for model, entry in answer.get("models", {}).items():
        for slot in entry["slots"]:
            last = slot.get("last") or {}
            took = f" in {last['seconds']:.2f}s" if "seconds" in last else ""
            why = f" ({slot['kept_out']})" if slot.get("kept_out") else ""
            typer.echo(f"{model}-{slot['slot']}: {slot['state']}{took}{why}")


def sleep(
    url: str = URL,
    level: int = typer.Option(
        1, min=0, max=2, help="1 keeps the weights in host memory, 2 drops them."
    ),
    model: str | None = MODEL,
    admin_key: str | None = ADMIN_KEY,
) -> None:
    """Put a model's slots (or every model's) to sleep: their engines' memory is freed."""
    params: dict[str, str | int] = {"level": level, **({"model": model} if model else {})}
    resp = httpx.post(
        url.rstrip("/") + "/sleep", params=params, headers=_headers(admin_key), timeout=600
    )
    _print_slots(_answer(resp))


def wake(url: str = URL, model: str | None = MODEL, admin_key: str | None = ADMIN_KEY) -> None:
    """Wake a model's slots (or every model's); each re-proves its numerics first."""
    params = {"model": model} if model else {}
    resp = httpx.post(
        url.rstrip("/") + "/wake_up", params=params, headers=_headers(admin_key), timeout=900
    )
    answer = _answer(resp)
    _print_slots(answer)
    if answer["status"] != "awake":
        raise typer.Exit(1)


def status(
    url: str = URL, api_key: str | None = API_KEY, as_json: bool = typer.Option(False, "--json")
) -> None:
    """Each model's state (awake, asleep, scaling...), its slots and autoscaling."""
    cards = _answer(
        httpx.get(url.rstrip("/") + "/v1/models", headers=_headers(api_key), timeout=60)
    )["data"]
    rows = [
        {
            "model": c["id"],
            "state": c.get("state"),
            "slots": c["slots"],
            "ready": sum(1 for s in c.get("slot_states", []) if s.get("state") == "awake"),
            "slot_states": [s.get("state") for s in c.get("slot_states", [])],
            "autoscaling": (
                f"{c['autoscaling']['min_slots']}..{c['autoscaling']['max_slots']}"
                if c.get("autoscaling")
                else "-"
            ),
        }
        for c in cards
    ]
    audit = _audit_of(url, api_key)
    for r in rows:
        r["audit"] = _model_audit(audit, r["model"])
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console  # typer's own dependency
    from rich.table import Table

    table = Table("model", "state", "slots", "ready", "per slot", "autoscaling", "audit")
    for r in rows:
        table.add_row(
            r["model"],
            str(r["state"]),
            str(r["slots"]),
            str(r["ready"]),
            " ".join(map(str, r["slot_states"])),
            r["autoscaling"],
            _audit_cell(r["audit"]),
        )
    console = Console()
    console.print(table)
    last = (audit or {}).get("last_mismatch")
    if last:
        console.print(
            f"last audit mismatch: {last['model']} class {last['numerics_class']} receipt "
            f"{last['receipt']}: recorded by slot {last['recorded_slot']}, answered otherwise "
            f"by slot {last['audit_slot']} ({last.get('verdict') or last.get('detail')})"
        )


def _audit_of(url: str, api_key: str | None) -> dict | None:
    """``GET /v1/audit`` (None where the gateway has none or it fails: status still prints)."""
    try:
        resp = httpx.get(url.rstrip("/") + "/v1/audit", headers=_headers(api_key), timeout=30)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


def _model_audit(audit: dict | None, model: str) -> dict | None:
    """One model's audit: re-answers by outcome over its classes, suspect classes, drains."""
    if not audit or not audit.get("enabled"):
        return None
    classes = [c for c in audit.get("classes", []) if c["model"] == model]
    return {
        **{k: sum(c[k] for c in classes) for k in ("same", "different", "failed")},
        "suspect": [c["numerics_class"] for c in classes if c["suspect"]],
        "drained": [d["slot"] for d in audit.get("drained", []) if d["model"] == model],
    }


def _audit_cell(audit: dict | None) -> str:
    if audit is None:
        return "off"
    cell = f"{audit['same']} same, {audit['different']} different, {audit['failed']} failed"
    if audit["suspect"]:
        cell += f"; suspect {','.join(audit['suspect'])}"
    if audit["drained"]:
        cell += f"; drained slot {','.join(map(str, audit['drained']))}"
    return cell
