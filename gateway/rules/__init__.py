"""Rule checks (exact match, regex, numbers, math equivalence, length) and the bounded
process pool that runs them with a per-check timeout."""
