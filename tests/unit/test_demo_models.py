"""The demo models build byte-identically, offline, load as HF checkpoints, and learned
their synthetic judging task (is a single-digit sum right?)."""

from __future__ import annotations

import json

from deployments.demo.models import DEMO_BUILDS, DEMO_MODELS, demo_build_of
from deployments.demo.training import chat_text, disrm_text, judge_prompt, sums_split
from deployments.engine.fingerprint import digest_dir


def test_build_reproduces_the_checked_in_bytes(demo_models):
    """The fixture built them in this checkout (CI: from scratch); the digests were
    checked in from earlier builds on each kind of CPU. Fails on a CPU kind not listed,
    and says what this one built."""
    built = {m.name: digest_dir(demo_models / m.name) for m in DEMO_MODELS}
    assert demo_build_of(demo_models) is not None, f"no known build matches: {built}"


def test_a_build_is_one_whole_known_set(tmp_path):
    """Mixing models of two CPU kinds is not a known build: the check is per set, not per
    model (a set is what one machine trains)."""

    sets = list(DEMO_BUILDS.values())
    assert len(sets) >= 2 and all(set(s) == {m.name for m in DEMO_MODELS} for s in sets)
    assert sets[0]["disrm-large"] == sets[1]["disrm-large"]  # untrained: the same bytes
    assert demo_build_of(tmp_path) is None  # nothing there
    for m in DEMO_MODELS:
        (tmp_path / m.name).mkdir()
        (tmp_path / m.name / "model.safetensors").write_bytes(b"not these bytes")
    assert demo_build_of(tmp_path) is None


def test_large_variant_is_wide_enough(demo_models):
    cfg = json.loads((demo_models / "disrm-large" / "config.json").read_text())
    assert cfg["hidden_size"] >= 1024 and cfg["num_labels"] == 1


def test_tokenizer_and_chat_template_load_offline(demo_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_models / "grm"))
    msgs = [{"role": "user", "content": "2+3=5? ü"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == chat_text(msgs, add_generation_prompt=True)
    assert tok.decode(tok(text)["input_ids"]) == text


def test_disrm_ranks_right_above_wrong_on_held_out_sums(demo_models):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_models / "disrm"))
    model = AutoModelForSequenceClassification.from_pretrained(str(demo_models / "disrm")).eval()

    _, held_out = sums_split()  # wrong answers never seen in training
    texts = [disrm_text(s.a, s.b, c) for s in held_out for c in (s.a + s.b, s.c)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    scores = [0.0] * len(texts)
    by_length: dict[int, list[int]] = {}
    for i, seq in enumerate(ids):
        by_length.setdefault(len(seq), []).append(i)
    for group in by_length.values():  # one forward per length: no padding, exact rows
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[i] for i in group])).logits[:, 0]
        for i, value in zip(group, logits.tolist(), strict=True):
            scores[i] = value
    wins = sum(scores[2 * k] > scores[2 * k + 1] for k in range(len(held_out)))
    assert wins / len(held_out) >= 0.9, f"right above wrong on only {wins}/{len(held_out)}"


def test_grm_answers_in_the_judge_format(demo_models):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_models / "grm"))
    model = AutoModelForCausalLM.from_pretrained(str(demo_models / "grm")).eval()
    for a, b, c in [(3, 4, 7), (2, 2, 5), (9, 0, 9), (1, 8, 2)]:
        prompt = chat_text([{"role": "user", "content": judge_prompt(a, b, c)}], True)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=10, do_sample=False, eos_token_id=258, pad_token_id=256
            )
        text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert text.strip() in ("Score: 0", "Score: 1"), text
