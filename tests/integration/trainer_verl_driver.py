"""Run verl 0.9.1's own reward-loop code against an rmgate address; print JSON.

Runs in the verl trainer env's python (``scripts/trainer_env.sh verl``), never in the main
venv, which has no verl. Reads one job from stdin::

    {"address": "127.0.0.1:PORT", "mode": "vllm" | "sglang" | "judge",
     "rm_path": "<reward model dir>", "policy_path": "<policy tokenizer dir>",
     "samples": [{"messages": [...], "response": str, "ground_truth": ..., "question": str}],
     "judge_kwargs": {...}}

and prints ``{"rewards": [...], "extra": [...], "versions": {...}}`` in sample order.

What is verl's and what is this harness's: the harness only builds what a verl trainer
would hand the reward loop — an OmegaConf config (verl's own ``reward.yaml`` defaults plus
the few fields set below) and one ``DataProto`` batch of tokenized rollouts, shaped like the
agent loop's output. Everything that touches HTTP is verl's: ``RewardLoopWorker`` (the
class ``RewardLoopManager`` runs as Ray actors; constructed here directly, with rmgate's
address where verl would pass its own router's) and its ``compute_score_batch``, which for
a DisRM goes through ``compute_score_disrm`` / ``_post_request`` and for a judge through
verl's ``NaiveRewardManager`` into ``examples/verl_reward_loop.py:compute_score_judge``.
No Ray cluster is started: ``RewardLoopWorker`` is a plain class until verl wraps it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import sys
from pathlib import Path
from typing import Any

# stdout carries only the JSON answer: whatever verl or transformers print goes to stderr.
RESULT_OUT, sys.stdout = sys.stdout, sys.stderr

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.reward_loop import RewardLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils import hf_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JUDGE_FN = REPO / "examples" / "verl_reward_loop.py"


def verl_config(job: dict[str, Any]) -> Any:
    """verl's own reward config defaults (its ``reward/reward.yaml``) with what a user sets
    to score with a reward model, plus the one actor field the worker reads (the policy's
    tokenizer, which decodes the rollouts)."""
    reward = OmegaConf.load(
        Path(verl.__file__).parent / "trainer" / "config" / "reward" / "reward.yaml"
    )
    reward.num_workers = 1
    reward.reward_model.enable = True
    reward.reward_model.model_path = job["rm_path"]
    # vllm -> /classify, sglang -> /v1/embeddings; a judge is reached through the custom
    # reward function, whatever the engine name says.
    reward.reward_model.rollout.name = "sglang" if job["mode"] == "sglang" else "vllm"
    if job["mode"] == "judge":
        reward.custom_reward_function.path = str(JUDGE_FN)
        reward.custom_reward_function.name = "compute_score_judge"
        reward.custom_reward_function.reward_kwargs = job.get("judge_kwargs", {})
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": job["policy_path"], "tokenizer_path": None}},
            "reward": reward,
        }
    )


def object_column(values: list[Any]) -> np.ndarray:
    """A 1-D object array (``np.array`` would turn equal-length message lists into 2-D)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def rollout_batch(samples: list[dict[str, Any]], tokenizer: Any) -> DataProto:
    """The samples as verl's agent loop hands them to the reward loop: left-padded prompt
    ids, right-padded response ids ending in EOS, one attention mask over both, and the
    non-tensor fields verl's reward code reads (``raw_prompt``, ``data_source``,
    ``reward_model.ground_truth``, ``extra_info``)."""
    pad = tokenizer.pad_token_id
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                s["messages"], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for s in samples
    ]
    responses = [
        tokenizer.encode(s["response"], add_special_tokens=False) + [tokenizer.eos_token_id]
        for s in samples
    ]
    plen = max(len(p) for p in prompts)
    rlen = max(len(r) for r in responses) + 2  # some padding, as in a real batch
    prompt_ids = torch.tensor([[pad] * (plen - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (rlen - len(r)) for r in responses])
    mask = torch.tensor(
        [
            [0] * (plen - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (rlen - len(r))
            for p, r in zip(prompts, responses)
        ]
    )
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": mask,
        },
        non_tensors={
            "raw_prompt": object_column([list(s["messages"]) for s in samples]),
            "data_source": object_column(["rmgate-sums"] * len(samples)),
            "reward_model": object_column(
                [{"ground_truth": s.get("ground_truth")} for s in samples]
            ),
            "extra_info": object_column([{"question": s.get("question", "")} for s in samples]),
        },
    )


async def main() -> None:
    job = json.load(sys.stdin)
    config = verl_config(job)
    worker = RewardLoopWorker(config, reward_router_address=job["address"])
    data = rollout_batch(job["samples"], hf_tokenizer(job["policy_path"]))
    outputs = await worker.compute_score_batch(data)
    json.dump(
        {
            "rewards": [o["reward_score"] for o in outputs],
            "extra": [o.get("reward_extra_info", {}) for o in outputs],
            "versions": {name: md.version(name) for name in ("verl", "transformers", "aiohttp")},
        },
        RESULT_OUT,
    )
    RESULT_OUT.flush()


if __name__ == "__main__":
    asyncio.run(main())
