"""Name the top-level modules an import needs that this Python lacks (run on the device).

    python -m benchmarks.gpu.find_missing [MODULE ...]   # default: vLLM's OpenAI server

Every missing module is replaced by a permissive stub (a package whose attributes are
classes you can subclass, call, index, decorate with and ``|`` in annotations), so one
import run finds all of them instead of stopping at the first. Where an import still fails
(a stub cannot stand in for a real value), the error and the missing names found so far are
printed and the next target is tried: the script never ends in a traceback of its own.

Prints ``MISSING name ...`` and, for each, the pip name vLLM's metadata gives (or the
module's own name), so the wheel list can be completed (see ``wheel_list.py``, which
computes the same list here on the CPU machine from the wheel's sources).
Exit status: 0 when nothing is missing, 1 otherwise.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import sys
import traceback
import types

missing: dict[str, str] = {}  # top-level name -> the module that imported it first
#: Optional or other-platform modules whose absence vLLM handles (never reported).
OPTIONAL = {
    "dill",
    "envwrap",
    "monkeytype",
    "torchcomms",
    "amdsmi",
    "libtpu",
    "pydot",
    "tpu_info",
    "torch_xla",
    "habana_frameworks",
    "intel_extension_for_pytorch",
    "vllm_tpu",
    "tpu_inference",
    "deep_gemm",
    "flashinfer",
    "triton_kernels",
    "flint",
    "gmpy2",
    "numexpr",
    "scipy",
    "matplotlib",
    "IPython",
    "pandas",
    "torch_npu",
    "modelscope",
    "vllm_xpu_kernels",
    "mori",
    "nixl_ep",
    "torchao",
}


class _StubMeta(type):
    """Stub attributes are classes: subclassable, callable, indexable, usable in ``|``."""

    def __getattr__(cls, key: str):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _stub_class(f"{cls.__qualname__}.{key}")

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        if (
            len(args) == 1
            and not kwargs
            and callable(args[0])
            and not isinstance(args[0], _StubMeta)
        ):
            return args[0]  # used as a bare decorator
        return super().__call__()

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0


def _stub_class(name: str) -> type:
    def inst_getattr(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _stub_class(f"{name}().{key}")

    def inst_call(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) else _stub_class(f"{name}()")()

    return _StubMeta(
        name.rsplit(".", 1)[-1],
        (),
        {
            "__getattr__": inst_getattr,
            "__call__": inst_call,
            "__qualname__": name,
            "__init__": lambda self, *a, **k: None,
        },
    )


class Stub(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _stub_class(f"{self.__name__}.{key}")


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: asked only for modules no real finder has."""

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top.startswith("_") or top in OPTIONAL:
            return None
        if top in sys.modules and not isinstance(sys.modules[top], Stub):
            return None  # a missing submodule of a real package: its own business
        if top not in missing:
            frame = next(
                (
                    f
                    for f in reversed(traceback.extract_stack()[:-1])
                    if "importlib" not in f.filename and f.filename != __file__
                ),
                None,
            )
            missing[top] = f"{frame.filename}:{frame.lineno}" if frame else "?"
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return Stub(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def pip_names() -> dict[str, str]:
    out = {}
    try:
        reqs = importlib.metadata.requires("vllm") or []
    except importlib.metadata.PackageNotFoundError:
        reqs = []
    for r in reqs:
        name = re.match(r"[A-Za-z0-9_.\-]+", r).group(0)
        out[name.lower().replace("-", "_")] = name
    return out


def main() -> int:
    sys.meta_path.append(Finder())
    failed = []
    for target in sys.argv[1:] or ["vllm.entrypoints.openai.api_server"]:
        try:
            __import__(target)
            print(f"imported {target}")
        except BaseException as exc:  # noqa: BLE001 - report and go on
            tb = traceback.extract_tb(exc.__traceback__)
            where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb)), "?")
            failed.append(target)
            print(f"import of {target} stopped at {where}: {type(exc).__name__}: {str(exc)[:300]}")
    names = pip_names()
    for top, first in sorted(missing.items()):
        print(
            f"  {top:<40} pip: {names.get(top.lower(), top.replace('_', '-')):<40} first imported at {first}"
        )
    print("MISSING", " ".join(sorted(missing)) or "(none)")
    return 1 if missing or failed else 0


if __name__ == "__main__":
    sys.exit(main())
