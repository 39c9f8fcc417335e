"""``python -m deployments.monitoring [--out DIR] [--check]``: write (or check) the
dashboard, its Grafana provisioning file and the alert rules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deployments.monitoring.render import GENERATED, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.monitoring", description=__doc__)
    parser.add_argument("--out", type=Path, default=GENERATED, help="default: %(default)s")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file is stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        old = stale(args.out)
        for rel in old:
            print(f"stale: {args.out / rel}", file=sys.stderr)
        return 1 if old else 0
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
