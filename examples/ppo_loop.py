"""A PPO-style loop's reward step, run twice: the rewards must match bit for bit.

    .venv/bin/rmgate demo &            # in another terminal
    .venv/bin/python examples/ppo_loop.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import random
import struct

from deployments.demo.training import sum_items  # stand-in rollouts: answers to sums
from gateway.client import RewardClient


def bits(xs: list[float]) -> bytes:
    return b"".join(struct.pack("<d", x) for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="rm", help="rm (DisRM) or judge (GRM)")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    batch = sum_items(args.batch, seed=0, right_fraction=0.6)
    first = RewardClient(args.url, model=args.model, concurrency=1).score(batch)
    shuffled = list(range(len(batch)))
    random.Random(1).shuffle(shuffled)
    second_raw = RewardClient(args.url, model=args.model, concurrency=32).score(
        [batch[i] for i in shuffled])
    second = [0.0] * len(batch)
    for pos, i in enumerate(shuffled):
        second[i] = second_raw[pos]
    right = [r for r, it in zip(first, batch) if it["response"] == it["label"]]
    wrong = [r for r, it in zip(first, batch) if it["response"] != it["label"]]
    print(f"mean reward: right answers {sum(right) / max(1, len(right)):.3f}, "
          f"wrong answers {sum(wrong) / max(1, len(wrong)):.3f}")
    same = bits(first) == bits(second)
    print(f"two runs (concurrency 1 in order, 32 shuffled): rewards match bitwise: {same}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
