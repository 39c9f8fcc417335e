"""The layout is the architecture: each layer imports only the layers below it.

Walks every module's imports with ``ast`` (function-level imports included) and fails when
a layer reaches one it must not, or when two modules import each other (directly or
around a longer circle). The layers, bottom to top (docs/architecture.md, "Layout"):

* ``gateway.core.*``: the pure core, framework-free policy and vocabulary, in subpackages
  by subject, each importing only the ones below it:
  ``api`` (errors, typed results, request schemas and parsing, what "the same answer"
  is) < ``config`` (the config schema, the scoring specs) < ``ledger_policy`` (a reward's
  identity, the ledger row, the cache's decisions, single flight) < ``routing`` (keys,
  hashing, numerics classes, placement and the class queue, slots, retries, deadlines, the
  router) < ``audit`` (what the continuous audit samples and what a mismatch proves) <
  ``elastic`` (sleep and wake of models, autoscaling rules) < ``vllm_api`` (the
  vLLM-shaped endpoints and the engine requests they make) < ``scoring`` (scorers,
  programs, rewards) < ``gateway.core.service`` (the front).
  pydantic and the stdlib only: no HTTP, Ray, vLLM or Prometheus.
* ``gateway.observability``: Prometheus metrics.
* ``gateway.transport``: reaching engines (slot directory, engine clients, the transport).
* ``gateway.ledger``: the reward ledger's stores and its writer (SQLite, PostgreSQL).
* ``gateway.rules``: the rule checks and the process pool that runs them.
* ``gateway.sandbox``: code sandboxes of ``code_tests`` rules (bwrap, Sandbox Fusion), the
  harness that runs inside them, ``rmgate sandbox serve``'s app.
* ``gateway.http``: the FastAPI app, the route table, the hot path, auth, errors, headers.
* ``deployments.engine`` / ``deployments.demo``: the vLLM process, its arguments, self-test,
  fingerprint; the demo models. The engine side: only the pure core below it.
* ``deployments.slot``: the Serve deployment that owns one engine.
* ``gateway.serve``: Serve application builders, topology, admin, proxy mode.
* ``gateway.cli``: the command line, on top of everything.
* ``gateway.client``: the trainer side, beside the server: only ``gateway.core`` below it.
* ``gateway.harness``: start, watch and stop a local rmgate from a script or a test (the
  tests and the benchmarks share it), beside the CLI: it starts ``rmgate serve`` as a
  process, so only ``gateway.core`` and ``deployments.engine`` below it; no vLLM, no pytest.
  Nothing on the serving path imports it.
* ``deployments.monitoring``: the Grafana dashboard and Prometheus alert rules, generated
  from code; imports no project layer (its tests compare its queries with the metrics).

Nothing in ``gateway`` or ``deployments`` imports ``tests`` or ``benchmarks``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HEAVY = {
    "fastapi",
    "starlette",
    "uvicorn",
    "ray",
    "aiohttp",
    "httpx",
    "prometheus_client",
    "vllm",
    "torch",
    "transformers",
    "typer",
    "httptools",
    "psycopg",
    "yaml",
    "pebble",
    "safetensors",
    "socket",
    "subprocess",
    "sqlite3",
    "urllib",
    "http",
    "tests",
    "benchmarks",
}
#: Nothing below the test and benchmark code imports it.
NEVER = {"tests", "benchmarks"}

#: The pure core's subpackages, bottom to top: each may import the ones before it.
CORE = [
    "gateway.core.api",
    "gateway.core.config",
    "gateway.core.ledger_policy",
    "gateway.core.routing",
    "gateway.core.audit",
    "gateway.core.elastic",
    "gateway.core.vllm_api",
    "gateway.core.scoring",
    "gateway.core.service",
]
ALL_CORE = set(CORE)

#: layer -> (allowed project layers, forbidden third-party top-level packages)
RULES: dict[str, tuple[set[str], set[str]]] = {
    **{layer: (set(CORE[:i]), HEAVY) for i, layer in enumerate(CORE)},
    "gateway.observability": (ALL_CORE, HEAVY - {"prometheus_client"}),
    "gateway.transport": (
        ALL_CORE | {"gateway.observability"},
        {"fastapi", "starlette", "uvicorn", "ray", "vllm", "torch", "typer"} | NEVER,
    ),
    "gateway.ledger": (
        ALL_CORE | {"gateway.observability"},
        {"fastapi", "starlette", "uvicorn", "ray", "aiohttp", "httpx", "vllm", "torch", "typer"}
        | NEVER,
    ),
    "gateway.rules": (
        ALL_CORE,
        {
            "fastapi",
            "starlette",
            "uvicorn",
            "ray",
            "aiohttp",
            "httpx",
            "vllm",
            "torch",
            "transformers",
            "typer",
        }
        | NEVER,
    ),
    "gateway.sandbox": (
        ALL_CORE | {"gateway.observability"},
        {"ray", "aiohttp", "vllm", "torch", "transformers", "typer"} | NEVER,
    ),
    "gateway.http": (
        ALL_CORE | {"gateway.observability"},
        {"ray", "aiohttp", "httpx", "vllm", "torch", "typer"} | NEVER,
    ),
    "gateway.client": (
        ALL_CORE,
        {
            "fastapi",
            "starlette",
            "uvicorn",
            "ray",
            "aiohttp",
            "prometheus_client",
            "vllm",
            "torch",
            "transformers",
            "typer",
        }
        | NEVER,
    ),
    "deployments.engine": (
        ALL_CORE,
        {"fastapi", "starlette", "ray", "aiohttp", "prometheus_client", "typer"} | NEVER,
    ),
    "deployments.demo": (
        {"deployments.engine"},
        {"fastapi", "starlette", "ray", "aiohttp", "prometheus_client", "httpx", "typer"} | NEVER,
    ),
    "deployments.slot": (
        ALL_CORE | {"deployments.engine"},
        {"fastapi", "aiohttp", "prometheus_client", "typer"} | NEVER,
    ),
    "gateway.serve": (
        ALL_CORE
        | {
            "gateway.observability",
            "gateway.transport",
            "gateway.ledger",
            "gateway.rules",
            "gateway.sandbox",
            "gateway.http",
            "deployments.engine",
            "deployments.slot",
        },
        {"typer"} | NEVER,
    ),
    "gateway.cli": (
        ALL_CORE
        | {
            "gateway.observability",
            "gateway.transport",
            "gateway.ledger",
            "gateway.rules",
            "gateway.sandbox",
            "gateway.http",
            "gateway.serve",
            "gateway.client",
            "deployments.engine",
            "deployments.slot",
            "deployments.demo",
        },
        NEVER,
    ),
    "gateway.harness": (
        ALL_CORE | {"deployments.engine"},
        {"vllm", "torch", "transformers", "typer", "pytest"} | NEVER,
    ),
    # generated artefacts only: no serving stack, no project layer (YAML and JSON out)
    "deployments.monitoring": (set(), HEAVY - {"yaml"}),
}
PACKAGE_INITS = {"gateway", "deployments", "gateway.core"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
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
                    out.append(f"{module}:{line} imports {name} ({layer} must not use {top_name})")
                if top_name in ("gateway", "deployments"):
                    target = layer_of(name)
                    if target is None and name in PACKAGE_INITS:
                        continue
                    if target is not None and target != layer and target not in allowed:
                        out.append(
                            f"{module}:{line} imports {name} ({layer} must not import {target})"
                        )
    return out


def test_layers_import_only_downward():
    assert violations(REPO) == []


def test_the_checker_catches_a_core_that_imports_fastapi(tmp_path):
    """The negative control: the same walk over a tree that breaks the rules."""
    for pkg in ("gateway/core/routing", "gateway/client", "deployments/engine"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "gateway/__init__.py").write_text("")
    (tmp_path / "deployments/__init__.py").write_text("")
    (tmp_path / "gateway/core/routing/bad.py").write_text(
        "def f():\n    from fastapi import FastAPI\n"
    )
    (tmp_path / "gateway/client/bad.py").write_text("from ..serve import app\n")
    (tmp_path / "deployments/engine/bad.py").write_text("import gateway.http.app\n")
    found = violations(tmp_path)
    assert any("gateway.core.routing.bad:2 imports fastapi" in v for v in found), found
    assert any("gateway.client.bad:1 imports gateway.serve" in v for v in found), found
    assert any("deployments.engine.bad:1 imports gateway.http" in v for v in found), found


@pytest.mark.parametrize("layer", sorted(RULES))
def test_every_layer_exists(layer):
    path = REPO / layer.replace(".", "/")
    assert list(path.glob("*.py")) or path.with_suffix(".py").is_file(), layer


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a import b`` counts ``a.b`` when
    that is a module, else ``a``)."""
    modules = {
        module_name(path, root): path
        for top in ("gateway", "deployments")
        for path in (root / top).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for _, name in imports_of(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and name not in PACKAGE_INITS:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert circles(import_graph(REPO)) == []


def test_the_circle_finder_finds_a_circle(tmp_path):
    """The negative control: two modules that import each other, one at function level."""
    (tmp_path / "gateway/cli").mkdir(parents=True)
    (tmp_path / "deployments").mkdir()
    for init in ("gateway/__init__.py", "gateway/cli/__init__.py", "deployments/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "gateway/cli/a.py").write_text("from gateway.cli.b import x\n")
    (tmp_path / "gateway/cli/b.py").write_text("def f():\n    from gateway.cli import a\n")
    assert circles(import_graph(tmp_path)) == [["gateway.cli.a", "gateway.cli.b"]]
