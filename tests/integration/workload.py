"""Request sets and replay helpers for the determinism tests (shared with ``rmgate check``)."""

from gateway.verify import Call, disrm_calls, essence, grm_calls, replay, shuffled  # noqa: F401
