"""verl 0.9.1's own reward loop, scoring with rmgate instead of reward servers of its own.

verl's reward loop (``verl.experimental.reward_loop``) reaches a reward model over HTTP:

* **DisRM, built in.** ``RewardLoopWorker.compute_score_disrm`` chat-templates
  ``raw_prompt`` + the decoded response with the reward model's tokenizer, strips one BOS,
  and POSTs ``{"model": reward.reward_model.model_path, "input": text, "use_activation":
  false}`` to ``http://<router>/classify`` (``reward.reward_model.rollout.name=vllm``), reading
  ``data[-1].probs[-1]``; with ``rollout.name=sglang`` it POSTs ``{"model", "input"}`` to
  ``/v1/embeddings`` and reads ``data[-1].embedding[-1]``.
* **GenRM.** verl ships no request code for a judge: its docs have the user's
  ``reward.custom_reward_function`` post a chat completion to the ``reward_router_address``
  the reward manager passes in. ``compute_score_judge`` below is that function for a judge
  rmgate serves.

Both expect verl's ``RewardModelManager`` to launch vLLM/SGLang servers plus a router and
hand the router's ``host:port`` to the workers. rmgate already *is* such a router, so the
only glue needed is a stand-in that launches nothing and hands out rmgate's address:
``use_rmgate()`` swaps ``ExternalRewardModel`` in for ``RewardModelManager``. verl's own
``RewardLoopManager``/``RewardLoopWorker`` code then runs unchanged (retries, request
bodies, score extraction).

Use it (the process that builds ``RewardLoopManager`` is verl's TaskRunner, a Ray actor, so
the swap has to happen in Ray's workers; put this file on their ``PYTHONPATH``)::

    RMGATE_REWARD_ADDRESS=127.0.0.1:8000 python -m verl.trainer.main_ppo ... \\
      reward.reward_model.enable=True \\
      reward.reward_model.model_path=/models/disrm \\
      reward.reward_model.rollout.name=vllm \\
      +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=verl_reward_loop.use_rmgate \\
      +ray_kwargs.ray_init.runtime_env.env_vars.RMGATE_REWARD_ADDRESS=127.0.0.1:8000

``reward.reward_model.model_path`` is sent as ``model``: rmgate accepts a model's configured
``model_path`` (resolved on the gateway host) as its name, and verl also loads the reward
tokenizer from it, so it must be the same path on both sides. For a judge add::

      reward.custom_reward_function.path=examples/verl_reward_loop.py \\
      reward.custom_reward_function.name=compute_score_judge \\
      +reward.custom_reward_function.reward_kwargs.model=judge \\
      '+reward.custom_reward_function.reward_kwargs.template=Is {prompt}{response} right?'

What the test suite checks (``tests/integration/test_trainer_packages.py``): verl's
``RewardLoopWorker`` (the class ``RewardLoopManager`` runs as Ray actors) constructed with
rmgate's address, its ``/classify`` scores against ``/v1/rewards``, and
``compute_score_judge`` called by verl's ``NaiveRewardManager``. The Ray wiring above
(``worker_process_setup_hook``) is not run by the tests: it needs a whole verl training job.
"""

from __future__ import annotations

import json
import os
from typing import Any

import aiohttp

# rmgate's own `last_int` parser: the judge's text is read as /v1/rewards reads it
from gateway.core.scoring.judge_parsers import parse_last_int

ADDRESS_ENV = "RMGATE_REWARD_ADDRESS"


class ExternalRewardModel:
    """Stands in for ``verl.experimental.reward_loop.RewardModelManager``.

    verl builds it with ``(config.reward.reward_model, rm_resource_pool)`` and then only
    calls ``get_router_address()`` (handed to every ``RewardLoopWorker``) and
    ``wake_up()``/``sleep()`` around each batch. rmgate runs on its own, so there is
    nothing to launch, wake or put to sleep.
    """

    def __init__(self, config: Any = None, resource_pool: Any = None,
                 address: str | None = None) -> None:
        address = address or os.environ.get(ADDRESS_ENV)
        if not address:
            raise ValueError(f"set {ADDRESS_ENV}=host:port (rmgate's address, no scheme: "
                             "verl requests http://<address>/classify)")
        # verl builds its URLs as f"http://{address}/{endpoint}": a scheme here would break them.
        self.address = address.removeprefix("http://").rstrip("/")

    def get_router_address(self) -> str:
        return self.address

    def wake_up(self) -> None:
        """rmgate's engines are always up: nothing to wake."""

    def sleep(self) -> None:
        """rmgate's engines are not verl's to put to sleep."""


def use_rmgate(address: str | None = None) -> None:
    """Make verl's ``RewardLoopManager`` use rmgate instead of launching reward servers.

    ``RewardLoopManager.__init__`` looks ``RewardModelManager`` up in its module's globals
    when it runs, so replacing that one name is enough, whenever this is called (before the
    manager is built). Called without arguments (as Ray's ``worker_process_setup_hook``),
    the address comes from ``RMGATE_REWARD_ADDRESS``.
    """
    from verl.experimental.reward_loop import reward_loop

    if address is not None:
        os.environ[ADDRESS_ENV] = address

    class _RmgateRewardModel(ExternalRewardModel):
        def __init__(self, config: Any = None, resource_pool: Any = None) -> None:
            super().__init__(config, resource_pool, address)

    reward_loop.RewardModelManager = _RmgateRewardModel


def judge_request(prompt: str, solution_str: str, ground_truth: Any, *, model: str | None,
                  template: str, sampling: dict[str, Any] | None) -> dict[str, Any]:
    """The chat-completions body for one sample.

    Without ``sampling`` the body carries only ``model`` and ``messages``, so rmgate applies
    the judge's configured ``sampling_defaults`` and derives the seed from the request:
    the same body ``/v1/rewards`` builds for the item, hence the same judge text and reward.
    """
    # as rmgate's /v1/rewards hands a label to the judge: a string as is, else JSON text
    label = "" if ground_truth is None else ground_truth if isinstance(ground_truth, str) \
        else json.dumps(ground_truth, ensure_ascii=False, sort_keys=True)
    content = template.format(prompt=prompt, response=solution_str, label=label)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    if model is not None:
        body["model"] = model
    body.update(sampling or {})
    return body


async def compute_score_judge(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: dict[str, Any] | None = None, *,
                              reward_router_address: str | None = None,
                              reward_model_tokenizer: Any = None, model: str | None = None,
                              template: str = "{prompt}{response}",
                              sampling: dict[str, Any] | None = None,
                              default: float = 0.0, **_: Any) -> dict[str, Any]:
    """verl GenRM reward function (``reward.custom_reward_function``) for an rmgate judge.

    verl's reward manager calls it once per sample with the decoded response, the ground
    truth, the sample's ``extra_info`` and the router address; the prompt is read from
    ``extra_info["question"]`` (verl's documented GenRM example does the same). ``model``
    defaults to the reward model's path (what verl's DisRM path sends; rmgate accepts it).
    A judge answer without an integer scores ``default`` and says so in ``judge_parsed``.
    """
    address = (reward_router_address or os.environ.get(ADDRESS_ENV) or "").removeprefix("http://")
    if not address:
        raise ValueError(f"no reward_router_address and no {ADDRESS_ENV}")
    if model is None and reward_model_tokenizer is not None:
        model = getattr(reward_model_tokenizer, "name_or_path", None)
    prompt = str((extra_info or {}).get("question", ""))
    body = judge_request(prompt, solution_str, ground_truth, model=model, template=template,
                         sampling=sampling)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.post(f"http://{address}/v1/chat/completions", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                # rmgate's errors are JSON with a message that says what to fix; a reward of
                # 0 here would silently train on a broken judge.
                raise RuntimeError(f"rmgate judge request failed: HTTP {resp.status}: {text}")
    answer = json.loads(text)["choices"][0]["message"]["content"] or ""
    parsed = parse_last_int(answer)
    # verl keeps every key as a per-sample column and leaves strings out of its metrics.
    return {"score": parsed if parsed is not None else float(default),
            "judge_parsed": float(parsed is not None), "judge_text": answer}
