"""Run OpenRLHF 0.11.2's own remote-reward code against rmgate URLs; print JSON.

OpenRLHF's reward client is ``SingleTurnAgentExecutor`` in ``openrlhf/utils/agent.py``:
``_fetch_rewards_via_http(queries, prompts, labels)`` shards a batch over the
``--reward.remote_url`` endpoints and POSTs ``{"query", "prompts", "labels"}`` to each, and
``execute()`` (what the vLLM engine actor runs per rollout) decodes prompt + generated tokens
into the query and keeps ``rewards``/``scores``/``extra_logs`` from the answer.

Loaded from the ``--no-deps`` package folder that ``scripts/trainer_env.sh openrlhf``
prints, without running the package's ``__init__`` files: ``openrlhf/utils/__init__.py``
imports ``math_utils`` (sympy, pylatexenc) and ``utils`` (torch, transformers, and through
``get_strategy`` DeepSpeed), none of which ``agent.py`` uses. So ``openrlhf`` and
``openrlhf.utils`` are registered as bare package shells whose ``__path__`` is the real
folder (so their real submodules import normally), and ``agent.py`` and the
``logging_utils.py`` it imports are the package's own files, executed unchanged. That is the
only thing replaced; no OpenRLHF function is stubbed.

Job on stdin::

    {"pkgs": "<folder>", "urls": [...],
     "calls": [{"queries": [...], "prompts": [...], "labels": [...]}],  # run concurrently
     "execute": {"tokenizer": "<dir>", "items": [{"prompt", "response", "label"}]}}

Answer: ``{"calls": [{"ok", "shards" | "error"}], "execute": [{"ok", "query", "reward",
"scores", "extra_logs"} | {"ok": false, "error"}]}``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

# OpenRLHF's logger writes to sys.stdout (bound when logging_utils is imported): send it to
# stderr so stdout carries only the JSON answer.
RESULT_OUT, sys.stdout = sys.stdout, sys.stderr


def load_agent_module(pkgs: Path) -> ModuleType:
    """``openrlhf.utils.agent`` from ``pkgs`` without the package ``__init__`` files."""
    for name, folder in (
        ("openrlhf", pkgs / "openrlhf"),
        ("openrlhf.utils", pkgs / "openrlhf" / "utils"),
    ):
        shell = types.ModuleType(name)
        shell.__path__ = [str(folder)]  # a package: its real submodules import from here
        shell.__file__ = None
        sys.modules[name] = shell
    spec = importlib.util.spec_from_file_location(
        "openrlhf.utils.agent", pkgs / "openrlhf" / "utils" / "agent.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class FixedEngine:
    """Stands in for OpenRLHF's vLLM engine in ``execute()``: the "generated" tokens of
    each prompt are given by the test (the reward path is what is under test, not
    generation)."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], tokenizer: Any) -> None:
        self.answers = answers
        self.tokenizer = tokenizer

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        ids = self.answers[tuple(prompt_token_ids)]
        out = SimpleNamespace(
            token_ids=ids, text=self.tokenizer.decode(ids), finish_reason="stop", logprobs=None
        )
        return SimpleNamespace(outputs=[out])


async def run_calls(executor: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def one(call: dict[str, Any]) -> dict[str, Any]:
        try:
            shards = await executor._fetch_rewards_via_http(
                call["queries"], call["prompts"], call["labels"]
            )
            return {"ok": True, "shards": shards}
        except Exception as exc:  # reported to the test, which says what rmgate answered
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def run_execute(executor: Any, spec: dict[str, Any]) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec["tokenizer"])
    items = spec["items"]
    answers = {
        tuple(tok(text=it["prompt"], add_special_tokens=False)["input_ids"]): tok(
            text=it["response"], add_special_tokens=False
        )["input_ids"]
        for it in items
    }
    engine = FixedEngine(answers, tok)

    async def one(it: dict[str, Any]) -> dict[str, Any]:
        params = SimpleNamespace(max_tokens=16, logprobs=None)
        out = await executor.execute(it["prompt"], it["label"], params, 1024, tok, engine)
        query = tok.decode(out["observation_tokens"], skip_special_tokens=False)
        # execute() logs and swallows reward errors, leaving reward None: report as such.
        return {
            "ok": out["reward"] is not None,
            "query": query,
            "reward": out["reward"],
            "scores": out["scores"],
            "extra_logs": out["extra_logs"],
        }

    return list(await asyncio.gather(*(one(it) for it in items)))


async def main() -> None:
    job = json.load(sys.stdin)
    agent = load_agent_module(Path(job["pkgs"]))
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=job["urls"])
    answer: dict[str, Any] = {"calls": await run_calls(executor, job.get("calls", []))}
    if job.get("execute"):
        answer["execute"] = await run_execute(executor, job["execute"])
    json.dump(answer, RESULT_OUT)
    RESULT_OUT.flush()


if __name__ == "__main__":
    asyncio.run(main())
