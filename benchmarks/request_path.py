"""Which of the project's files one request runs through, and how often the gateway
serializes or parses JSON for it: the ingress's ASGI app over a transport that answers at
no cost (``benchmarks/ingress_cpu.py``'s app), one warm request, then one traced.

    python -m benchmarks.request_path [--items N] [--out FILE]

Run from another checkout (``PYTHONPATH=<tree>``) to compare two versions of the code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.ingress_cpu import REQUESTS, gateway_app, post

ROOT = Path(__file__).resolve().parents[1]
#: C functions that turn Python objects into JSON text or back (the stdlib's and orjson's)
JSON_CALLS = {"dumps": "serialize", "loads": "parse"}
VALIDATES = ("model_validate", "model_validate_json", "validate_python", "validate_json")


def trace(path: str, body: bytes) -> dict[str, Any]:
    app = gateway_app()
    asyncio.run(post(app, path, body))  # warm: imports, caches
    files: list[str] = []
    layers: list[str] = []  # the package of each call, runs of one package counted once
    counts = {"serialize": 0, "parse": 0, "validate": 0}
    by_caller: dict[str, int] = {}

    def count(kind: str, caller: str) -> None:
        # the canned engine's own JSON (making its answer) is the engine's work, not the gateway's
        if not caller.endswith("canned_engine.py"):
            counts[kind] += 1
            where = f"{kind} in {caller.split('/')[-2]}/{caller.split('/')[-1]}"
            by_caller[where] = by_caller.get(where, 0) + 1

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            name = code.co_filename
            if name.startswith(str(ROOT)) and "/benchmarks/" not in name and "/.venv/" not in name:
                if name not in files:
                    files.append(name)
                layer = str(Path(name).parent)
                if layers[-1:] != [layer]:
                    layers.append(layer)
            caller = frame.f_back.f_code.co_filename if frame.f_back else ""
            if name.endswith("json/__init__.py") and code.co_name in JSON_CALLS:
                count(JSON_CALLS[code.co_name], caller)
            elif name.endswith("pydantic/main.py") and code.co_name in VALIDATES:
                count("validate", caller)
        elif event == "c_call":
            fn = getattr(arg, "__name__", "")
            owner = (
                getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__name__
            )
            if fn in JSON_CALLS and "orjson" in str(owner):
                count(JSON_CALLS[fn], frame.f_code.co_filename)
            elif fn in ("validate_python", "validate_json") and owner == "SchemaValidator":
                count("validate", frame.f_code.co_filename)

    async def traced() -> int:
        sys.setprofile(profile)
        try:
            return await post(app, path, body)
        finally:
            sys.setprofile(None)

    status = asyncio.run(traced())
    assert status == 200, status
    rel = [str(Path(f).relative_to(ROOT)) for f in files]
    return {
        "files": len(rel),
        "package_changes": len(layers) - 1,
        **counts,
        "by_caller": by_caller,
        "packages": sorted({str(Path(f).parent) for f in rel}),
        "order": rel,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=8, help="items in the /v1/rewards request")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out: dict[str, Any] = {}
    for name, path, obj in REQUESTS:
        if name == "rewards":
            obj = {
                **obj,
                "items": [{"prompt": "3+4=", "response": str(i)} for i in range(args.items)],
            }
        out[name] = trace(path, json.dumps(obj).encode())
        shown = ("files", "package_changes", "serialize", "parse", "validate")
        print(name, {k: out[name][k] for k in shown})
    if args.out:
        args.out.write_text(json.dumps({"items": args.items, "requests": out}, indent=2))


if __name__ == "__main__":
    main()
