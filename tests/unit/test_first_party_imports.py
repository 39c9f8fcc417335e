"""Every import of the project's own names resolves, the ones inside functions included.

Benchmarks and test helpers import lazily (inside ``main`` or a fixture) so that a module
loads without Ray or vLLM; the type checker does not cover ``benchmarks/`` and ``tests/``,
so a renamed class would otherwise surface only when someone runs the benchmark.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("gateway", "deployments", "benchmarks", "tests")


def unresolved(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in FIRST_PARTY:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FIRST_PARTY:
                    importlib.import_module(alias.name)
    return missing


def test_every_first_party_import_resolves():
    files = [p for top in FIRST_PARTY for p in sorted((ROOT / top).rglob("*.py"))]
    assert len(files) > 100
    missing = [m for f in files for m in unresolved(f)]
    assert missing == []
