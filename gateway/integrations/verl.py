"""Public alias of ``gateway.client.verl`` for verl configs that name this file:

    reward.custom_reward_function.path=<site-packages>/gateway/integrations/verl.py

verl loads the file by path and looks up ``compute_score`` in it, so this file re-exports
the functions (a ``sys.modules`` swap would not reach verl's loader).
"""

from gateway.client.verl import build_item, compute_score, compute_score_async  # noqa: F401

__all__ = ["build_item", "compute_score", "compute_score_async"]
