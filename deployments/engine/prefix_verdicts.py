"""Failed prefix-cache checks, remembered on the host that saw them.

A slot with ``prefix_cache: auto`` starts its engine with the cache on and proves it
(``deployments.engine.prefix_check``); where the cache changes bits, the engine restarts
without it. Whether it does is a property of the kernels, the model and the host, so the
same slot would start twice again after every engine death, scale-up or gateway restart.
This module keeps each such failure in a small JSON file under the state directory
(``$RMGATE_STATE_DIR``, else the XDG state directory: the ledger's), keyed by the
numerics identity of the cache-on engine (model digest, vLLM version, CPU or GPU, mode,
dtype, attention, kernel settings), so that an identical engine starts without the cache
at once.

Only failures that changed bits are kept: a remembered failure can only turn the cache
off, which never changes an answer (it costs the shared prompt's reuse); a pass is proven
again at every start. A new model, engine version, host or setting is another key and is
checked afresh; deleting the file checks again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from deployments.engine.prefix_check import PrefixCheckResult
from gateway.core.config.settings import default_state_dir

logger = logging.getLogger("ray.serve")

#: Part of every key: a change to the check's probes makes earlier verdicts stale.
CHECK_VERSION = 1
VERDICTS_DIR = "prefix-check"


def verdict_key(identity: dict[str, Any]) -> str:
    """The key of a cache-on engine's verdict: a hash of its numerics identity."""
    blob = json.dumps(
        {"check": CHECK_VERSION, "identity": identity}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def verdicts_dir(state_dir: str | None = None) -> Path:
    return Path(state_dir or default_state_dir()).expanduser() / VERDICTS_DIR


def changed_bits(result: PrefixCheckResult) -> bool:
    """A failure worth remembering: warm answers differed from cold ones while the cache
    served (not a probe that failed to answer, which may be the moment's)."""
    return (
        not result.passed
        and bool(result.hit_tokens)
        and min(result.single, result.batched) < result.total
    )


def remember_failure(
    identity: dict[str, Any], result: PrefixCheckResult, state_dir: str | None = None
) -> Path | None:
    """Keep ``result`` for ``identity`` if it shows the cache changing bits; returns the
    file written, or None (a pass, a probe failure, or a directory that cannot be written:
    the next start then checks again, which is only slower)."""
    if not changed_bits(result):
        return None
    folder = verdicts_dir(state_dir)
    path = folder / f"{verdict_key(identity)}.json"
    record = {"check": result.as_dict(), "identity": identity, "recorded_at": time.time()}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".verdict-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, sort_keys=True)
        os.replace(tmp, path)  # atomic: two slots of a model may write it at once
    except OSError as exc:
        logger.warning("prefix-cache verdict not kept (%s): %s", path, exc)
        return None
    return path


def recall_failure(identity: dict[str, Any], state_dir: str | None = None) -> dict[str, Any] | None:
    """The remembered failure for ``identity``, as ``/v1/models`` shows a check
    (``{"enabled": False, "check": ..., "remembered": {"file", "recorded_at"}}``), or
    None when there is none (or it cannot be read: the engine then checks again)."""
    path = verdicts_dir(state_dir) / f"{verdict_key(identity)}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        check = dict(record["check"])
        recorded_at = float(record["recorded_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {
        "enabled": False,
        "check": check,
        "remembered": {"file": str(path), "recorded_at": recorded_at},
    }
