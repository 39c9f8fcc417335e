"""The layout is the architecture: each layer imports only the layers below it.

Walks every module's imports with ``ast`` (function-level imports included) and fails when
a layer reaches one it must not. The layers, bottom to top (docs/design.md, "Layout"):

* ``gateway.core``: framework-free policy and vocabulary (keys, placement, seeds, errors,
  typed results, the transport protocol, the config schema). pydantic and the stdlib only.
* ``gateway.observability``: Prometheus metrics.
* ``gateway.transport``: reaching engines (slot directory, gates, engine clients).
* ``gateway.ledger``: the reward ledger's stores and its writer (SQLite, PostgreSQL).
* ``gateway.rules``: the rule checks and the process pool that runs them (pebble,
  math-verify).
* ``gateway.http``: the FastAPI app (routers, auth, error rendering, headers).
* ``deployments.engine`` / ``deployments.demo``: the vLLM process, its arguments, self-test,
  fingerprint; the demo models.
* ``deployments.slot``: the Serve deployment that owns one engine.
* ``gateway.serve``: Serve application builders, topology, admin, proxy mode.
* ``gateway.cli``: the command line, on top of everything.
* ``gateway.client``: the trainer side, beside the server: only ``gateway.core`` below it.
* ``gateway.harness``: start, watch and stop a local rmgate from a script or a test (the
  tests and the benchmarks share it), beside the CLI: it starts ``rmgate serve`` as a
  process, so only ``gateway.core`` and ``deployments.engine`` below it; no vLLM, no pytest.
  Nothing on the serving path imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HEAVY = {"fastapi", "starlette", "uvicorn", "ray", "aiohttp", "httpx", "prometheus_client",
         "vllm", "torch", "transformers", "typer"}

#: layer -> (allowed project layers, forbidden third-party top-level packages)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "gateway.core": (set(), HEAVY),
    "gateway.observability": ({"gateway.core"}, HEAVY - {"prometheus_client"}),
    "gateway.transport": ({"gateway.core", "gateway.observability"},
                          {"fastapi", "starlette", "uvicorn", "ray", "vllm", "torch", "typer"}),
    "gateway.ledger": ({"gateway.core", "gateway.observability"},
                       {"fastapi", "starlette", "uvicorn", "ray", "aiohttp", "httpx", "vllm",
                        "torch", "typer"}),
    "gateway.rules": ({"gateway.core"},
                      {"fastapi", "starlette", "uvicorn", "ray", "aiohttp", "httpx", "vllm",
                       "torch", "transformers", "typer"}),
    "gateway.http": ({"gateway.core", "gateway.observability"},
                     {"ray", "aiohttp", "httpx", "vllm", "torch", "typer"}),
    "gateway.client": ({"gateway.core"},
                       {"fastapi", "starlette", "uvicorn", "ray", "aiohttp",
                        "prometheus_client", "vllm", "torch", "transformers", "typer"}),
    "deployments.engine": ({"gateway.core"},
                           {"fastapi", "starlette", "ray", "aiohttp", "prometheus_client",
                            "typer"}),
    "deployments.demo": ({"deployments.engine"},
                         {"fastapi", "starlette", "ray", "aiohttp", "prometheus_client", "httpx",
                          "typer"}),
    "deployments.slot": ({"gateway.core", "deployments.engine"},
                         {"fastapi", "aiohttp", "prometheus_client", "typer"}),
    "gateway.serve": ({"gateway.core", "gateway.observability", "gateway.transport", "gateway.ledger", "gateway.rules",
                       "gateway.http", "deployments.engine", "deployments.slot"}, {"typer"}),
    "gateway.cli": ({"gateway.core", "gateway.observability", "gateway.transport", "gateway.ledger", "gateway.rules",
                     "gateway.http", "gateway.serve", "gateway.client", "deployments.engine",
                     "deployments.slot", "deployments.demo"}, set()),
    "gateway.harness": ({"gateway.core", "deployments.engine"},
                        {"vllm", "torch", "transformers", "typer", "pytest"}),
}
#: Thin aliases at public import paths: they belong to the layer they point into.
ALIASES = {"gateway.app": "gateway.serve", "gateway.cli_ledger": "gateway.cli", "gateway.integrations": "gateway.client",
           "deployments.replica": "deployments.slot",
           "deployments.engine_launcher": "deployments.engine"}
PACKAGE_INITS = {"gateway", "deployments"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    for alias, layer in ALIASES.items():
        if module == alias or module.startswith(alias + "."):
            return layer
    for layer in RULES:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{a.name}") for a in node.names]
    return found


def violations(root: Path) -> list[str]:
    out = []
    for top in ("gateway", "deployments"):
        for path in sorted((root / top).rglob("*.py")):
            module = module_name(path, root)
            if module in PACKAGE_INITS:
                continue
            layer = layer_of(module)
            if layer is None:
                out.append(f"{module}: belongs to no layer (add it to a layer's package)")
                continue
            allowed, forbidden = RULES[layer]
            for line, name in imports_of(path, module):
                top_name = name.split(".")[0]
                if top_name in forbidden:
                    out.append(f"{module}:{line} imports {name} ({layer} must not use "
                               f"{top_name})")
                if top_name in ("gateway", "deployments"):
                    target = layer_of(name)
                    if target is None and name in PACKAGE_INITS | {"gateway.integrations"}:
                        continue
                    if target is not None and target != layer and target not in allowed:
                        out.append(f"{module}:{line} imports {name} ({layer} must not import "
                                   f"{target})")
    return out


def test_layers_import_only_downward():
    assert violations(REPO) == []


def test_the_checker_catches_a_core_that_imports_fastapi(tmp_path):
    """The negative control: the same walk over a tree that breaks the rules."""
    for pkg in ("gateway/core", "gateway/client", "deployments/engine"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "gateway/__init__.py").write_text("")
    (tmp_path / "deployments/__init__.py").write_text("")
    (tmp_path / "gateway/core/bad.py").write_text("def f():\n    from fastapi import FastAPI\n")
    (tmp_path / "gateway/client/bad.py").write_text("from ..serve import app\n")
    (tmp_path / "deployments/engine/bad.py").write_text("import gateway.http.app\n")
    found = violations(tmp_path)
    assert any("gateway.core.bad:2 imports fastapi" in v for v in found), found
    assert any("gateway.client.bad:1 imports gateway.serve" in v for v in found), found
    assert any("deployments.engine.bad:1 imports gateway.http" in v for v in found), found


@pytest.mark.parametrize("layer", sorted(RULES))
def test_every_layer_exists(layer):
    path = REPO / layer.replace(".", "/")
    assert list(path.glob("*.py")) or path.with_suffix(".py").is_file(), layer
