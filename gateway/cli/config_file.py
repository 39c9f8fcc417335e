"""Reading a Ray Serve config file the way every ``rmgate`` command does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def load_serve_config(path: Path) -> dict[str, Any]:
    """The config file as a dict; a usage error when it holds no Serve application."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or not data.get("applications"):
        raise typer.BadParameter(f"{path} is not a Ray Serve config file (no `applications`)")
    return data


def render(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as Serve runs it: one application per slot plus the ingress's."""
    from gateway.serve import topology

    return topology.render(cfg)
