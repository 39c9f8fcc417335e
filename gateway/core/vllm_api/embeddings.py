"""``/v1/embeddings`` for a DisRM: the classifier's raw logits in OpenAI's embeddings shape.

SGLang serves a sequence classifier's logits as its "embedding", and verl's SGLang reward
path posts ``{"model", "input"}`` to ``/v1/embeddings`` and reads ``data[-1].embedding[-1]``
as the score. A user who moves that config onto rmgate gets the same DisRM score there:
the request is the ``/classify`` request ``{"model", "input", "use_activation": false}``
(same key, same slot, same bits), answered in the embeddings shape.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from gateway.core.api.schemas import EmbeddingRequest


def classify_body(req: EmbeddingRequest, model: str) -> dict[str, Any]:
    """The ``/classify`` request an embeddings request stands for (raw logits)."""
    return {"model": model, "input": req.input, "use_activation": False}


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embeddings_from_classify(body: bytes, model: str, encoding_format: str) -> bytes:
    """vLLM's ``/classify`` answer as OpenAI's embeddings answer, item order kept."""
    out = json.loads(body)
    data = [
        {
            "object": "embedding",
            "index": item.get("index", i),
            "embedding": _encode([float(x) for x in item["probs"]], encoding_format),
        }
        for i, item in enumerate(out.get("data", []))
    ]
    usage = out.get("usage") or {}
    answer = {
        "id": str(out.get("id", "embd")),
        "object": "list",
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "total_tokens": int(usage.get("total_tokens") or 0),
        },
    }
    return json.dumps(answer, ensure_ascii=False, allow_nan=False).encode("utf-8")
