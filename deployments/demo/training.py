"""Train the demo reward models for a few seconds on a synthetic judging task.

The task: is a single-digit sum right? ``a+b=c`` with ``a, b`` in 0..9.

* The GRM (judge) learns to answer ``Is 3+4=7 right?`` with ``Score: 1`` or ``Score: 0``,
  the format the demo's ``last_int`` parser reads.
* The DisRM learns a logit that is high for right sums and low for wrong ones, on the
  chat-templated conversation ``user: 3+4=`` / ``assistant: 7`` (what verl's ``/classify``
  path builds from messages + response).

Training is deterministic so the build stays byte-identical: one thread, deterministic
algorithms, eager attention, fixed data order and initial weights. Some wrong answers are
held out of training so the tests can check that the DisRM ranks right above wrong on
sums it has not seen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

CHAT_OPEN, CHAT_CLOSE = "<|im_start|>", "<|im_end|>"
JUDGE_TEMPLATE = "Is {prompt}{response} right?"
#: Adam at 3e-3 stalls at the constant predictor here; 3e-4 learns the task in ~20 s.
LR = 3e-4
BATCH = 32


def judge_prompt(a: int, b: int, c: int) -> str:
    return JUDGE_TEMPLATE.format(prompt=f"{a}+{b}=", response=str(c))


def chat_text(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The demo chat template (same as the tokenizer's jinja template), in Python."""
    out = "".join(f"{CHAT_OPEN}{m['role']}\n{m['content']}{CHAT_CLOSE}\n" for m in messages)
    return out + (f"{CHAT_OPEN}assistant\n" if add_generation_prompt else "")


@dataclass(frozen=True)
class Sum:
    a: int
    b: int
    c: int

    @property
    def right(self) -> bool:
        return self.a + self.b == self.c


def sums_split(seed: int = 7) -> tuple[list[Sum], list[Sum]]:
    """(train, held_out): every right sum is in train; one wrong answer per pair is held out."""
    rng = random.Random(seed)
    train, held = [], []
    for a in range(10):
        for b in range(10):
            wrong = [c for c in range(19) if c != a + b]
            rng.shuffle(wrong)
            held.append(Sum(a, b, wrong[0]))
            train += [Sum(a, b, a + b)] + [Sum(a, b, c) for c in wrong[1:5]]
    return train, held


def sum_items(n: int, seed: int = 0, right_fraction: float = 0.5) -> list[dict[str, str]]:
    """Reward items on the task: ``{"prompt": "a+b=", "response": c, "label": a+b}``,
    a ``right_fraction`` of them right (stand-ins for a policy's rollouts)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        c = a + b if rng.random() < right_fraction else rng.randrange(19)
        out.append({"prompt": f"{a}+{b}=", "response": str(c), "label": str(a + b)})
    return out


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _set_deterministic(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _batches(n: int, batch: int, steps: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < batch * steps:
        idx = list(range(n))
        rng.shuffle(idx)
        order += idx
    return [order[i * batch : (i + 1) * batch] for i in range(steps)]


def _pad(seqs: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def train_grm(model: Any, tokenizer: Any, pad_id: int, steps: int = 300, seed: int = 11) -> None:
    """Teacher-forced judge answers; loss on the assistant's answer tokens only."""
    import torch

    _set_deterministic(seed)
    train, _ = sums_split()
    rows = []
    for s in train:
        prompt = chat_text(
            [{"role": "user", "content": judge_prompt(s.a, s.b, s.c)}], add_generation_prompt=True
        )
        answer = f"Score: {int(s.right)}{CHAT_CLOSE}\n"
        p, a = _encode(tokenizer, prompt), _encode(tokenizer, answer)
        rows.append((p + a, len(p)))
    # Right sums are 1 in 5 of the rows: weight them up so the judge does not learn "0".
    weights = [4.0 if s.right else 1.0 for s in train]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    for batch in _batches(len(rows), BATCH, steps, seed):
        ids, mask = _pad([rows[i][0] for i in batch], pad_id)
        labels = ids.clone()
        for j, i in enumerate(batch):
            labels[j, : rows[i][1]] = -100
        labels[mask == 0] = -100
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        target = labels[:, 1:]
        tok_loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            target.reshape(-1),
            ignore_index=-100,
            reduction="none",
        ).view(target.shape)
        w = torch.tensor([weights[i] for i in batch]).unsqueeze(1)
        loss = (tok_loss * w).sum() / ((target != -100).float() * w).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def disrm_text(a: int, b: int, c: int) -> str:
    """What the DisRM scores: the conversation user ``a+b=`` / assistant ``c``."""
    return chat_text(
        [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(c)}]
    )


def train_disrm(model: Any, tokenizer: Any, pad_id: int, steps: int = 700, seed: int = 13) -> None:
    """Binary cross-entropy on the single logit: right sums high, wrong sums low."""
    import torch

    _set_deterministic(seed)
    train, _ = sums_split()
    rows = [_encode(tokenizer, disrm_text(s.a, s.b, s.c)) for s in train]
    labels = torch.tensor([1.0 if s.right else 0.0 for s in train])
    pos_weight = torch.tensor(4.0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    for batch in _batches(len(rows), BATCH, steps, seed):
        ids, mask = _pad([rows[i] for i in batch], pad_id)
        logit = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logit, labels[batch], pos_weight=pos_weight
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
