"""Do a GPU benchmark model's scores carry the computation, or only its last token?

The 7-8B GPU layouts run vLLM's ``load_format: dummy`` (weights drawn in ``[-1e-3, 1e-3]``
at start-up) to skip writing 15 GB per model. A bitwise check is only evidence where the
score depends on what the layers compute: otherwise two batchings cannot differ and the
``off`` negative control shows nothing. This asks it of small models of each architecture
(``benchmarks/gpu/models_gpu.py``'s configs, a 512-wide 4-layer classifier, vLLM CPU):
six inputs that share their last token, scored raw (no activation), with dummy weights
and with the seeded std-scaled random weights ``models_gpu`` writes. One child process
per model (vLLM's engine must start in a fresh process).

    .venv/bin/python -m benchmarks.dummy_weights [--out benchmarks/reports/dummy_weights-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Six inputs ending in the same token: a score that sees only that token repeats.
TEXTS = ["a", "ba", "cba", "hello worlda", "the quick brown fox a", "0123456789" * 20 + "a"]


def child(arch: str, weights: str, root: Path) -> dict[str, Any]:
    """Build the model, score ``TEXTS`` alone and in one batch of 48, return the counts."""
    from benchmarks.gpu import models_gpu as mg
    from deployments.demo import models as demo

    s = demo.GpuModelShape(
        name=f"small-{arch}-{weights}",
        kind="discriminative",
        hidden_size=512,
        intermediate_size=1024,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        vocab_size=1024,
        tie_word_embeddings=False,
        weights=weights,
        seed=3,
        arch=arch,
    )
    out = Path(mg.build_shape(root, s)["path"])
    from vllm import LLM, PoolingParams

    llm = LLM(
        model=str(out),
        runner="pooling",
        load_format="dummy" if weights == "dummy" else "auto",
        dtype="bfloat16",
        max_model_len=1024,
        enforce_eager=True,
        max_num_seqs=64,
    )
    raw = PoolingParams(use_activation=False)
    alone = [tuple(llm.classify([t], pooling_params=raw)[0].outputs.probs) for t in TEXTS]
    batch = [tuple(o.outputs.probs) for o in llm.classify(TEXTS * 8, pooling_params=raw)]
    return {
        "arch": arch,
        "weights": weights,
        "scores_alone": [[float(x).hex() for x in a] for a in alone],
        "distinct_scores_of_6": len(set(alone)),
        "alone_vs_batched_differ_of_6": sum(a != b for a, b in zip(alone, batch[: len(TEXTS)])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the results here (JSON)")
    ap.add_argument("--child", nargs=3, metavar=("ARCH", "WEIGHTS", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        arch, weights, root = args.child
        print("RESULT " + json.dumps(child(arch, weights, Path(root))), flush=True)
        return
    root = Path(os.environ.get("TMPDIR", "/tmp")) / "rmgate-dummy-weights"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    rows = []
    for arch in ("llama", "qwen2"):
        for weights in ("dummy", "random"):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.dummy_weights",
                    "--child",
                    arch,
                    weights,
                    str(root),
                ],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(f"{arch}/{weights} failed:\n{proc.stderr[-3000:]}")
            row = json.loads(line[-1][len("RESULT ") :])
            rows.append(row)
            print(
                f"{arch:6} {weights:6} distinct scores {row['distinct_scores_of_6']}/6, "
                f"alone vs batched differ {row['alone_vs_batched_differ_of_6']}/6",
                flush=True,
            )
    report = {
        "command": "python -m benchmarks.dummy_weights",
        "date": datetime.date.today().isoformat(),
        "texts_share_last_token": True,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
