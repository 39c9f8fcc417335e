"""The demo models build byte-identically, offline, and load as HF checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys

from deployments.demo_models import DEMO_MODELS, build_demo_models

# sha256 of each model folder (deployments.fingerprint.digest_dir), checked in.
EXPECTED = {
    "grm": "e4f912051067dc4c78633008a776b2c7af2f50d0437b3c25b965238018b1ab29",
    "disrm": "cb3caa96384842f513e39dda54bcb831f768a5f889a3379edc876bc48f83d08c",
    "disrm-large": "eaa582da4ba23ec3b1da5f8849ca0dc7d54baf0fe9cade28d788622fe8439520",
}


def test_build_is_byte_identical_and_matches_checked_in_digests(tmp_path):
    first = build_demo_models(tmp_path / "a", ["grm", "disrm"])
    # A second build in another process (other hash salt, fresh torch state).
    code = ("import json, sys; from deployments.demo_models import build_demo_models; "
            "print(json.dumps(build_demo_models(sys.argv[1], ['grm', 'disrm'])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True,
                         capture_output=True, text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == first
    assert first == {k: EXPECTED[k] for k in first}


def test_large_variant_is_wide_enough(demo_models):
    cfg = json.loads((demo_models / "disrm-large" / "config.json").read_text())
    assert cfg["hidden_size"] >= 1024 and cfg["num_labels"] == 1
    assert {m.name for m in DEMO_MODELS} == set(EXPECTED)


def test_tokenizer_and_chat_template_load_offline(demo_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_models / "grm"))
    text = tok.apply_chat_template([{"role": "user", "content": "2+3=5? ü"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok(text)["input_ids"]) == text
