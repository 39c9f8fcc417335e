"""The continuous audit's policy: which rows are re-answered, and what a mismatch proves."""
