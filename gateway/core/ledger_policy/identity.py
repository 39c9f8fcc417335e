"""A reward's identity: what names one reward among millions, for the ledger and the cache.

The crc32 key (``gateway.core.routing.keys``) is the routing hash and stays one: 32 bits are far
too few to *name* rewards (at a million rewards a collision is near certain). An answer is
a pure function of the engine body and the numerics class that computes it, so its
identity is a sha256 over exactly those: the model, the class's identity (vLLM version,
model digest, device, mode, dtype, parallelism: ``gateway.core.routing.numerics``), the endpoint
and the canonical engine body. Each part is length-prefixed, so no two different
tuples hash the same bytes.
"""

from __future__ import annotations

import hashlib


def reward_identity(model: str, numerics_class: str, path: str, body: bytes) -> str:
    """The identity (64 hex characters) of the answer ``numerics_class`` gives to ``body``
    on ``path`` for ``model``; the receipt a trainer keeps."""
    digest = hashlib.sha256()
    for part in (model.encode(), numerics_class.encode(), path.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def group_row_identity(program: str, component: str, group_identity: str) -> str:
    """The identity of a group scorer's row: one per (program, component, group)."""
    digest = hashlib.sha256()
    for part in (b"group", program.encode(), component.encode(), group_identity.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
