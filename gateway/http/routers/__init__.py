"""Endpoints by family: engine-shaped (generative, discriminative), rewards, ops."""
