"""The ingress's code sandboxes: built and probed (a real run in each) before the replica
serves, so a host that cannot sandbox code fails the replica's start with the fix named,
never runs code unsandboxed."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from gateway.core.config.code_rules import CodeTestsRule
from gateway.core.config.settings import AppConfig
from gateway.sandbox.runner import CodeSandboxes, code_rules


def start_code_sandboxes(config: AppConfig) -> CodeSandboxes | None:
    """Every ``code_tests`` rule's sandbox, probed (None: the config has none).
    ``SandboxUnavailable`` when one cannot run here. The probe runs on an event loop of
    its own (a replica's constructor may already run inside one)."""
    rules = code_rules(config)
    if not rules:
        return None
    sandboxes = CodeSandboxes(rules)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, sandboxes.probe()).result()
    return sandboxes


def probe_serve_config(cfg: dict[str, Any]) -> None:
    """Probe every ``code_tests`` rule of a serve config (its applications' raw ``args``)
    before Ray starts: ``SandboxUnavailable`` names the fix in seconds, where a replica
    that failed its own probe would surface minutes later inside Ray's report."""
    rules: dict[str, CodeTestsRule] = {}
    for application in cfg.get("applications") or []:
        for program in (application.get("args") or {}).get("programs") or []:
            for comp in program.get("components") or []:
                rule = comp.get("rule") or {}
                if rule.get("type") == "code_tests":
                    name = f"{program.get('name')}/{comp.get('name')}"
                    rules[name] = CodeTestsRule.model_validate(rule)
    if rules:
        asyncio.run(CodeSandboxes(rules).probe())
