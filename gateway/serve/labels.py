"""Label token ids of the logprob judges, resolved once at start from each model's
tokenizer (the ``judge_prob`` and ``expected_rating`` scorers read the log-probability of
given token ids, so the strings of the config become ids here).

A label must be exactly one token (``encode(label, add_special_tokens=False)`` of the
model's tokenizer):
a label of two tokens has no single probability at the first answer position, and reading
its first token alone would silently mix labels that share it. Ids set in the config are
kept as they are (a model folder without a tokenizer, or a token the strings cannot name).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from gateway.core.config.scoring import ExpectedRatingSpec, JudgeProbSpec
from gateway.core.config.settings import AppConfig


@cache
def _encoder(model_path: str) -> Any:
    """``text -> ids`` of the model's tokenizer: its ``tokenizer.json`` with the
    ``tokenizers`` library (what a fast HF tokenizer runs; milliseconds to load), else
    ``transformers``' AutoTokenizer (seconds to import, in the ingress's start)."""
    path = Path(model_path) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        return lambda text: fast.encode(text, add_special_tokens=False).ids
    from transformers import AutoTokenizer

    slow = AutoTokenizer.from_pretrained(model_path)
    return lambda text: slow.encode(text, add_special_tokens=False)


def token_id(model_path: str, text: str, where: str) -> int:
    ids = _encoder(model_path)(text)
    if len(ids) != 1:
        raise ValueError(
            f"{where}: label {text!r} is {len(ids)} tokens {ids} of the model's "
            f"tokenizer, not one; pick a one-token label or set the token ids"
        )
    return int(ids[0])


def _resolved(scorer: Any, model_path: str, where: str) -> Any:
    if isinstance(scorer, JudgeProbSpec) and scorer.label_token_ids is None:
        yes = [token_id(model_path, t, where) for t in scorer.yes]
        no = [token_id(model_path, t, where) for t in scorer.no]
        return type(scorer).model_validate(
            {**scorer.model_dump(), "yes_token_ids": yes, "no_token_ids": no}
        )
    if isinstance(scorer, ExpectedRatingSpec) and scorer.rating_token_ids is None:
        ids = [token_id(model_path, t, where) for t in scorer.ratings]
        return type(scorer).model_validate({**scorer.model_dump(), "rating_token_ids": ids})
    return scorer


def resolve_label_tokens(config: AppConfig) -> AppConfig:
    """``config`` with every logprob judge's label token ids filled in."""
    data = config.model_dump()
    for i, model in enumerate(config.models):
        data["models"][i]["scorer"] = _resolved(
            model.scorer, model.model_path, f"model {model.name!r}"
        ).model_dump()
    for p, program in enumerate(config.programs):
        for c, comp in enumerate(program.components):
            if comp.scorer is not None:
                spec = config.model(comp.model or "")
                assert spec is not None
                where = f"program {program.name!r}, component {comp.name!r}"
                data["programs"][p]["components"][c]["scorer"] = _resolved(
                    comp.scorer, spec.model_path, where
                ).model_dump()
    return AppConfig.model_validate(data)


def uses_rules(config: AppConfig) -> bool:
    return any(
        c.rule is not None and c.rule.type != "code_tests"
        for p in config.programs
        for c in p.components
    )
