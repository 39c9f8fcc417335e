"""Which wheels vLLM's OpenAI server (and rmgate around it) needs on the lent H200 beyond
what the device image and ../shared/gpu/stage.sh already bring: computed from imports.

Runs here, on the CPU machine, after ``stage.sh`` (it reads the vLLM wheel that stage.sh
downloaded; nothing is imported or executed). It follows the import graph from the entry
modules (by default ``vllm.entrypoints.openai.api_server``, the pooling and chat serving
paths and the offline ``vllm.entrypoints.llm``) through vLLM's own sources, and collects the
third-party top-level modules that are imported

* at module level, unconditionally (not under ``TYPE_CHECKING``, not inside a
  ``try`` that catches ``ImportError``): these make the import fail;
* inside functions of the modules on that path (``--lazy`` lists them too): these fail
  only when the feature that imports them is used.

A module is available when it is in the standard library, in the device image
(``device_image.txt``: the distributions KINDS.md lists for the H200 image, by their import
names) or in one of the staged wheels (their ``top_level.txt``/RECORD). What is left is
mapped to a pip name (vLLM's Requires-Dist where it names it) and printed, one per line:

    python -m benchmarks.gpu.wheel_list                 # names
    python -m benchmarks.gpu.wheel_list --download DIR  # also: pip download them (and the
                                                        # dependencies they declare) to DIR

``--download`` repeats for the downloaded wheels' own Requires-Dist, so the closure is
complete (e.g. model_hosting_container_standards -> jmespath, supervisor).
"""

from __future__ import annotations

import argparse
import ast
import glob
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STAGE_CACHE = Path(os.environ.get("GPU_STAGE_CACHE", REPO / ".gpu-stage" / "cache"))
ENTRIES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.llm",
    "vllm.entrypoints.pooling",
    "vllm.entrypoints.openai.chat_completion",
    "vllm.v1.engine.core",
    "vllm.model_executor.model_loader.dummy_loader",
    "vllm.model_executor.models.qwen2",
)
#: import name -> pip name, where they differ and vLLM's metadata does not say.
PIP_NAMES = {
    "yaml": "PyYAML",
    "zmq": "pyzmq",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "cpuinfo": "py-cpuinfo",
    "google": "protobuf",
    "dateutil": "python-dateutil",
    "pythonjsonlogger": "python-json-logger",
    "supervisor": "supervisor",
    "jmespath": "jmespath",
    "sklearn": "scikit-learn",
    "pynvml": "nvidia-ml-py",
    "multipart": "python-multipart",
    "dotenv": "python-dotenv",
}
#: Platform or optional modules vLLM probes for and works without on CUDA (never shipped).
OPTIONAL = {
    "flashinfer",
    "deep_gemm",
    "triton_kernels",
    "amdsmi",
    "habana_frameworks",
    "torch_xla",
    "libtpu",
    "tpu_info",
    "vllm_tpu",
    "tpu_inference",
    "torch_npu",
    "intel_extension_for_pytorch",
    "zentorch",
    "aiter",
    "quack",
    "tilelang",
    "cutlass",
    "nvidia_cutlass_dsl",
    "flash_attn",
    "fa3_fwd_interface",
    "humming",
    "tokenspeed_mla",
    "fastsafetensors",
    "instanttensor",
    "runai_model_streamer",
    "tensorizer",
    "helion",
    "cudnn",
    "vllm_gguf_plugin",
    "gguf",
    "torchcomms",
    "pplx_kernels",
    "deep_ep",
    "nixl",
    "mooncake",
    "lmcache",
    "ray",
    "pandas",
    "scipy",
    "matplotlib",
    "datasets",
    "plotly",
    "av",
    "soundfile",
    "soxr",
    "librosa",
    "decord",
    "timm",
    "torchaudio",
    "torchvision",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class Source:
    """vLLM's Python files, read from the wheel (no extraction, nothing executed)."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.files = {n for n in self.zip.namelist() if n.endswith(".py")}
        meta = next(n for n in self.zip.namelist() if n.endswith(".dist-info/METADATA"))
        self.requires = [
            line.split(":", 1)[1].strip()
            for line in self.zip.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]

    def path_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.files:
                return cand
        return None

    def is_package(self, module: str) -> bool:
        return (module.replace(".", "/") + "/__init__.py") in self.files

    def tree(self, module: str) -> ast.Module | None:
        p = self.path_of(module)
        return ast.parse(self.zip.read(p)) if p else None


def _catches_import_error(node: ast.Try) -> bool:
    for h in node.handlers:
        names = []
        if h.type is None:
            return True
        for t in h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]:
            names.append(getattr(t, "id", getattr(t, "attr", "")))
        if {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"} & set(names):
            return True
    return False


TIERS = ("hard", "startup", "cond", "optional", "lazy", "lazy-cond")
RANK = {t: i for i, t in enumerate(TIERS)}


def imports_of(tree: ast.Module, module: str, is_pkg: bool) -> list[tuple[str, str, bool]]:
    """(absolute module name, tier, maybe-a-submodule) of every import in ``tree``. Tiers:
    ``hard`` module level; ``cond`` under an ``if`` (not TYPE_CHECKING); ``optional`` in a
    ``try`` that catches ImportError; ``lazy`` inside a function, ``lazy-cond`` under an
    ``if`` or ``try`` there."""
    out: list[tuple[str, str, bool]] = []
    pkg = module if is_pkg else module.rpartition(".")[0]

    def absolute(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = pkg.split(".")
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        return [mod] + [f"{mod}.{a.name}" for a in node.names if a.name != "*"]

    def worst(a: str, b: str) -> str:
        return a if RANK[a] >= RANK[b] else b

    def visit(nodes, how: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend((a.name, how, False) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names = absolute(node)
                out.append((names[0], how, False))
                out.extend((n, how, True) for n in names[1:])  # `from a import b`: a.b?
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    visit(node.orelse, how)
                    continue
                under = "lazy-cond" if how.startswith("lazy") else worst(how, "cond")
                visit(node.body, under)
                visit(node.orelse, under)
            elif isinstance(node, ast.Try):
                opt = "lazy-cond" if how.startswith("lazy") else worst(how, "optional")
                inner = opt if _catches_import_error(node) else how
                visit(node.body, inner)
                for h in node.handlers:
                    visit(h.body, opt)
                visit(node.orelse, inner)
                visit(node.finalbody, how)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, "lazy")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, how)
            elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.While)):
                visit(node.body, how)

    visit(tree.body, "hard")
    return out


def scan(src: Source, entries: tuple[str, ...]) -> dict[str, dict[str, set[str]]]:
    """{third-party top-level name: {tier: {importing vllm modules}}}. A vLLM module's tier is
    the best path to it; a function-level import of a vLLM module inside
    ``vllm.entrypoints`` counts as ``startup`` (the server's set-up functions run them at
    start: routers, instrumentator), elsewhere as ``lazy``."""
    import heapq

    reach: dict[str, int] = {}
    heap = [(0, e) for e in entries]
    found: dict[str, dict[str, set[str]]] = {}
    while heap:
        rank, mod = heapq.heappop(heap)
        if mod in reach and reach[mod] <= rank:
            continue
        reach[mod] = rank
        tree = src.tree(mod)
        if tree is None:
            continue
        parts = mod.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ first
        for i in range(1, len(parts)):
            heapq.heappush(heap, (rank, ".".join(parts[:i])))
        for name, how, maybe in imports_of(tree, mod, src.is_package(mod)):
            top = name.split(".")[0]
            if top == "vllm":
                if maybe and not src.path_of(name):
                    continue
                if how == "lazy" and mod.startswith("vllm.entrypoints"):
                    how = "startup"
                heapq.heappush(heap, (max(rank, RANK[how]), name))
                continue
            if maybe or not top or top.startswith("_"):
                continue
            tier = TIERS[max(rank, RANK[how])]
            found.setdefault(top, {}).setdefault(tier, set()).add(mod)
    return found


def image_modules() -> set[str]:
    lines = (HERE / "device_image.txt").read_text().splitlines()
    return {w for line in lines for w in line.split("#")[0].split()}


def staged_modules(cache: Path) -> set[str]:
    """Top-level import names of every wheel stage.sh downloaded (and of .gpu-stage/extra)."""
    out: set[str] = set()
    wheels = glob.glob(str(cache / "dl" / "*.whl")) + glob.glob(
        str(REPO / ".gpu-stage" / "extra" / "*.whl")
    )
    for whl in wheels:
        out |= wheel_top_level(Path(whl))
    return out


def wheel_top_level(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as z:
        tl = [n for n in z.namelist() if n.endswith(".dist-info/top_level.txt")]
        if tl:
            return {x.strip() for x in z.read(tl[0]).decode().split() if x.strip()}
        tops = set()
        for n in z.namelist():
            head = n.split("/")[0]
            if ".dist-info" in head or ".data" in head:
                continue
            tops.add(head[:-3] if head.endswith(".py") else head.split(".")[0])
        return tops


def requirement_names(requires: list[str]) -> dict[str, str]:
    """norm(name) -> name for unconditional (no extra) requirements."""
    out = {}
    for r in requires:
        if "extra ==" in r:
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", r).group(0)
        out[norm(name)] = name
    return out


def pip_name(top: str, reqs: dict[str, str]) -> str:
    if top in PIP_NAMES:
        return PIP_NAMES[top]
    return reqs.get(norm(top), top.replace("_", "-"))


def pip_download(names: list[str], dest: Path) -> None:
    plats = []
    for p in (
        "manylinux2014_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_34_x86_64",
        "manylinux1_x86_64",
    ):
        plats += ["--platform", p]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *plats,
            "-d",
            str(dest),
            *names,
        ],
        check=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="the vLLM wheel (default: stage.sh's download)")
    ap.add_argument("--entry", action="append", help="entry module (repeatable)")
    ap.add_argument("--lazy", action="store_true", help="also list function-level imports")
    ap.add_argument("--download", type=Path, help="pip download the missing wheels here")
    ap.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="more pip names to add (rmgate's own needs beyond the image)",
    )
    args = ap.parse_args()
    wheel = args.wheel or Path(
        next(iter(sorted(glob.glob(str(STAGE_CACHE / "dl" / "vllm-*.whl")))), "")
    )
    if not wheel.is_file():
        sys.exit("wheel_list: no vLLM wheel; run ../shared/gpu/stage.sh first or pass --wheel")
    src = Source(wheel)
    reqs = requirement_names(src.requires)
    have = set(sys.stdlib_module_names) | image_modules() | staged_modules(STAGE_CACHE) | {"vllm"}
    found = scan(src, tuple(args.entry or ENTRIES))

    def best(t: str) -> str:
        return min(found[t], key=RANK.__getitem__)

    missing = sorted(
        (t for t in found if t not in have and t not in OPTIONAL), key=lambda t: (RANK[best(t)], t)
    )
    hard = [t for t in missing if best(t) in ("hard", "startup")]
    for t in hard:
        print(f"{pip_name(t, reqs)}\t# import {t} ({best(t)}: {sorted(found[t][best(t)])[0]})")
    if args.lazy:
        for t in missing:
            if t not in hard:
                print(
                    f"# {best(t)}: {pip_name(t, reqs)}\t(import {t} in {sorted(found[t][best(t)])[0]})"
                )
    names = [pip_name(t, reqs) for t in hard] + list(args.extra)
    if args.download and names:
        args.download.mkdir(parents=True, exist_ok=True)
        done: set[str] = set()
        while names:
            pip_download(names, args.download)
            done |= {norm(n) for n in names}
            names = []
            for whl in sorted(args.download.glob("*.whl")):
                with zipfile.ZipFile(whl) as z:
                    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
                    text = z.read(meta).decode()
                for dep in requirement_names(
                    [
                        line.split(":", 1)[1].strip()
                        for line in text.splitlines()
                        if line.startswith("Requires-Dist:") and "python_version < " not in line
                    ]
                ).values():
                    mods = {
                        dep.replace("-", "_"),
                        dep.replace("-", "_").lower(),
                        PIP_NAMES.get(dep, dep),
                    }
                    if (
                        norm(dep) in done
                        or mods & have
                        or norm(dep) in {norm(x) for x in image_distributions()}
                    ):
                        continue
                    if norm(dep) == "typing-extensions":
                        continue  # never shipped: the image's is newer (../shared/gpu/README.md)
                    names.append(dep)
                    done.add(norm(dep))
            if names:
                print("# dependencies of those: " + " ".join(names))
        print(
            f"# downloaded to {args.download}: "
            + " ".join(sorted(p.name for p in args.download.glob("*.whl")))
        )


def image_distributions() -> list[str]:
    out = []
    for line in (HERE / "device_image.txt").read_text().splitlines():
        if line.startswith("# dists:"):
            out += line.split(":", 1)[1].split()
    return out


if __name__ == "__main__":
    main()
