"""The trainer side: ``RewardClient``, the verl integration, ``rmgate check``.

Imports nothing server-side (no Ray, vLLM, FastAPI, aiohttp, Prometheus): only httpx,
pydantic, tqdm and the framework-free ``gateway.core``. ``pip install rmgate`` suffices.
"""

from gateway.client.reward_client import RetryPolicy, RewardClient, RewardRequestError, run_sync

__all__ = ["RewardClient", "RewardRequestError", "RetryPolicy", "run_sync"]
