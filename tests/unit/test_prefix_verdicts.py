"""Failed prefix-cache checks remembered on the host: what is kept, what is recalled, and a
slot whose identical engine failed before starts without the cache, once (the real
engines: tests/integration/test_prefix_cache.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from deployments.engine import prefix_verdicts
from deployments.engine.args import Platform
from deployments.engine.prefix_check import PrefixCheckResult, run_prefix_check
from deployments.engine.prefix_verdicts import (
    changed_bits,
    recall_failure,
    remember_failure,
    verdicts_dir,
)
from deployments.slot import replica as replica_module
from gateway.core.config.settings import ModelSpec
from tests.unit.test_prefix_check import CachingEngine

IDENTITY = {"engine": "vllm", "version": "0.32.0", "model": "ab" * 32, "prefix_cache": True}


def failed_check() -> PrefixCheckResult:
    return run_prefix_check(
        "http://engine", "discriminative", "m", transport=httpx.MockTransport(CachingEngine(True))
    )


def test_a_failure_that_changed_bits_is_recalled_for_that_identity_only(tmp_path):
    result = failed_check()
    assert changed_bits(result)
    path = remember_failure(IDENTITY, result, str(tmp_path))
    assert path is not None and path.parent == verdicts_dir(str(tmp_path))
    recalled = recall_failure(IDENTITY, str(tmp_path))
    assert recalled is not None and recalled["enabled"] is False
    assert recalled["check"] == result.as_dict()
    assert recalled["remembered"]["file"] == str(path)
    for other in ({"version": "0.33.0"}, {"model": "cd" * 32}, {"prefix_cache": None}):
        assert recall_failure({**IDENTITY, **other}, str(tmp_path)) is None


@pytest.mark.parametrize(
    "result",
    [
        PrefixCheckResult(True, 4, 4, 4, 512.0),  # a pass is proven again at every start
        PrefixCheckResult(False, 0, 0, 4, None, "probe failed: ReadTimeout"),  # the moment's
        PrefixCheckResult(False, 4, 4, 4, 0.0, "the cache served no prefix"),  # proves nothing
    ],
)
def test_only_bit_changes_are_kept(tmp_path, result):
    assert not changed_bits(result)
    assert remember_failure(IDENTITY, result, str(tmp_path)) is None
    assert recall_failure(IDENTITY, str(tmp_path)) is None


def test_an_unreadable_verdict_checks_again(tmp_path):
    path = remember_failure(IDENTITY, failed_check(), str(tmp_path))
    assert path is not None
    path.write_text("{not json")
    assert recall_failure(IDENTITY, str(tmp_path)) is None


def test_an_unwritable_state_dir_is_no_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert remember_failure(IDENTITY, failed_check(), str(blocker)) is None


class FakeEngine:
    """Records the plans it is started with; never starts anything."""

    started: list[Any] = []

    def __init__(self, plan: Any, host: str, port: int, name: str) -> None:
        self.plan, self.url = plan, f"http://{host}:{port}"
        FakeEngine.started.append(plan)

    def start(self) -> None:
        pass

    def wait_ready(self, timeout_s: float) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def bare_slot(tmp_path, monkeypatch):
    """A SlotReplica's start path alone: its class without Serve, a fake engine, a model
    folder and the state directory in ``tmp_path``."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("RMGATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(replica_module, "EngineProcess", FakeEngine)
    FakeEngine.started = []
    cls = replica_module.SlotReplica.func_or_class
    slot = cls.__new__(cls)
    slot.spec = ModelSpec(
        name="rm", kind="discriminative", model_path=str(model), prefix_cache="auto"
    )
    slot.slot, slot.platform, slot.prefix_cache = 0, Platform("cpu", "cpu"), None
    return slot


def cache_flag(plan: Any) -> str:
    return next(a for a in plan.args if a.endswith("enable-prefix-caching"))


def test_a_slot_whose_engine_failed_here_before_starts_without_the_cache(bare_slot):
    spec = bare_slot.spec
    running = bare_slot._start_engine(spec)
    assert running.prefix_cache == "auto" and bare_slot.prefix_cache is None
    assert cache_flag(FakeEngine.started[-1]) == "--enable-prefix-caching"
    # what the replica does after a failed check: remember it under the cache-on identity
    assert remember_failure(bare_slot._identity(spec), failed_check()) is not None
    running = bare_slot._start_engine(spec)
    assert running.prefix_cache == "off"
    assert cache_flag(FakeEngine.started[-1]) == "--no-enable-prefix-caching"
    assert bare_slot.plan.prefix_cache is False
    report = bare_slot.prefix_cache
    assert report["enabled"] is False and "differ warm alone" in report["check"]["reason"]
    assert Path(report["remembered"]["file"]).is_file()
    # the same model under another mode (another identity) is checked afresh
    other = spec.model_copy(update={"determinism": "off"})
    assert bare_slot._start_engine(other).prefix_cache == "auto"


def test_the_key_is_the_identity_not_the_slot(bare_slot, monkeypatch):
    spec = bare_slot.spec
    bare_slot._start_engine(spec)
    first = prefix_verdicts.verdict_key(bare_slot._identity(spec))
    bare_slot.slot = 1
    bare_slot._start_engine(spec)
    assert prefix_verdicts.verdict_key(bare_slot._identity(spec)) == first
