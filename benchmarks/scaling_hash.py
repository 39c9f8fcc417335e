"""Keys moved and load balance on N -> N+1 slots: rmgate's jump hash vs plain crc32 % N.

Pure computation over request-shaped keys (crc32 of canonical bodies), no engine: shows
why routing uses consistent hashing. Writes JSON and a PNG plot.

    .venv/bin/python -m benchmarks.scaling_hash [--keys 100000] [--max-slots 16] [--quick]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gateway.core.routing.hashing import slot_for_key
from gateway.core.routing.keys import request_key

REPO = Path(__file__).resolve().parents[1]


def request_keys(n: int) -> list[int]:
    """Keys of n distinct /classify bodies, as the gateway computes them."""
    return [
        request_key("/classify", {"model": "rm", "input": f"sample {i}: 3+{i % 10}={i % 19}"})
        for i in range(n)
    ]


def measure(keys: list[int], max_slots: int) -> list[dict]:
    rows = []
    for n in range(1, max_slots + 1):
        jump_a = [slot_for_key(k, n) for k in keys]
        jump_b = [slot_for_key(k, n + 1) for k in keys]
        mod_a = [k % n for k in keys]
        mod_b = [k % (n + 1) for k in keys]

        def balance(slots: list[int], buckets: int) -> float:
            counts = [0] * buckets
            for s in slots:
                counts[s] += 1
            return max(counts) / (len(slots) / buckets)

        rows.append(
            {
                "n": n,
                "ideal_moved": 1 / (n + 1),
                "jump_moved": sum(a != b for a, b in zip(jump_a, jump_b)) / len(keys),
                "mod_moved": sum(a != b for a, b in zip(mod_a, mod_b)) / len(keys),
                "jump_max_over_mean": balance(jump_b, n + 1),
                "mod_max_over_mean": balance(mod_b, n + 1),
            }
        )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(ns, [100 * r["mod_moved"] for r in rows], "o-", label="crc32 % N")
    ax1.plot(ns, [100 * r["jump_moved"] for r in rows], "s-", label="rmgate (jump hash)")
    ax1.plot(ns, [100 * r["ideal_moved"] for r in rows], "k--", label="ideal 1/(N+1)")
    ax1.set(
        title="Keys that change slot on N → N+1", xlabel="N (slots before)", ylabel="keys moved (%)"
    )
    ax1.legend()
    ax2.plot(ns, [r["mod_max_over_mean"] for r in rows], "o-", label="crc32 % N")
    ax2.plot(ns, [r["jump_max_over_mean"] for r in rows], "s-", label="rmgate (jump hash)")
    ax2.axhline(1.05, color="k", linestyle="--", label="target 1.05")
    ax2.set(
        title="Load balance after scaling (N+1 slots)",
        xlabel="N (slots before)",
        ylabel="max / mean keys per slot",
    )
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--max-slots", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="10,000 keys")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    rows = measure(request_keys(10_000 if args.quick else args.keys), args.max_slots)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling_hash.json").write_text(json.dumps(rows, indent=2))
    plot(rows, args.out / "scaling_hash.png")
    print(
        f"{'N->N+1':>7}{'ideal %':>9}{'jump %':>9}{'crc%N %':>9}{'jump bal':>10}{'crc%N bal':>11}"
        f"{'moved crc%N/jump':>18}"
    )
    for r in rows:
        ratio = r["mod_moved"] / r["jump_moved"] if r["jump_moved"] else float("inf")
        print(
            f"{r['n']:>4}->{r['n'] + 1:<2}{100 * r['ideal_moved']:>9.2f}{100 * r['jump_moved']:>9.2f}"
            f"{100 * r['mod_moved']:>9.2f}{r['jump_max_over_mean']:>10.3f}"
            f"{r['mod_max_over_mean']:>11.3f}{ratio:>18.1f}"
        )
    print(f"wrote {args.out / 'scaling_hash.json'} and {args.out / 'scaling_hash.png'}")


if __name__ == "__main__":
    main()
