"""List the top-level modules vLLM's OpenAI server imports that this Python lacks.

Missing modules are replaced by permissive stubs so that one import run finds them all
(the staged vLLM of ../shared/gpu covers the offline engine, not every server import).
Prints the missing names and which of them are vLLM requirements (pip names)."""

import importlib.abc
import importlib.util
import sys
import types
from unittest.mock import MagicMock

missing: set[str] = set()
#: Optional or other-platform modules whose presence would change what vLLM does.
OPTIONAL = {"dill", "envwrap", "monkeytype", "torchcomms", "amdsmi", "libtpu", "pydot",
            "tpu_info", "torch_xla", "habana_frameworks", "intel_extension_for_pytorch",
            "vllm_tpu", "tpu_inference", "deep_gemm", "flashinfer", "triton_kernels", "flint",
            "gmpy2", "numexpr", "scipy", "matplotlib", "IPython", "pandas"}


class Stub(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return MagicMock()


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        real = top in sys.modules and not isinstance(sys.modules[top], Stub)
        if top.startswith("_") or real or top in OPTIONAL:
            return None  # a platform module, or an optional part of a real package
        missing.add(top)
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        return Stub(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.append(Finder())
for target in sys.argv[1:] or ["vllm.entrypoints.openai.api_server"]:
    try:
        __import__(target)
    except Exception as exc:  # noqa: BLE001 - report and go on
        print("import error:", target, repr(exc)[:300])
print("MISSING", " ".join(sorted(missing)))
