"""The GPU benchmarks, run as modules from the checkout root on the lent machine
(``python -m benchmarks.gpu.bench_paths --layout core-0.5b --out $OUT``; ``README.md`` here)."""
