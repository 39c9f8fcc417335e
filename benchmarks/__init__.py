"""rmgate's benchmarks, run as modules from the checkout root
(``.venv/bin/python -m benchmarks.side_by_side --quick``); numbers in ``benchmarks/README.md``.
What they share with the tests (starting and stopping a gateway, CPU accounting, the
least-loaded baseline) lives in ``gateway.harness``."""
