"""What can go wrong with a sandbox itself (not with the code it runs: that is a test's
outcome). Translated to a rule failure (``RuleCheckFailed``, reason ``sandbox``) where a
submission is run, and to a start-up error where the sandbox is probed."""

from __future__ import annotations


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (no ``bwrap``, no user namespaces, a service that does
    not answer); the message names the fix."""


class SandboxFailed(RuntimeError):
    """One submission's sandbox ended without verdicts (killed from outside, a harness
    that could not start)."""
