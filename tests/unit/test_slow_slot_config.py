"""``benchmarks/slow_slot.py``'s config, on the CPU host and on the GPU host (``--gpu``): the
same three ingresses over the very same slot applications, and on the GPU six engines that
fit one GPU in Ray's accounting with explicit KV caches (no memory profiling)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from benchmarks.slow_slot import ENGINE, ENGINE_GPU, config
from gateway.core.config.settings import GatewaySettings


def _slots(cfg: dict) -> dict[str, dict]:
    return {a["name"]: a["args"]["spec"] for a in cfg["applications"] if "spec" in a["args"]}


@pytest.mark.parametrize("gpu", [False, True])
def test_three_ingresses_share_six_slots(gpu):
    cfg = config(Path("/m"), "answer_time", gpu=gpu)
    ingresses = {a["route_prefix"]: a for a in cfg["applications"] if "models" in a["args"]}
    assert set(ingresses) == {"/", "/pinned", "/noqueue"}
    assert ingresses["/pinned"]["args"]["gateway"]["placement"] == "pinned"
    assert ingresses["/noqueue"]["args"]["gateway"]["experimental"]["class_queue"] is False
    assert ingresses["/"]["args"]["gateway"]["experimental"]["load_weight"] == "answer_time"
    slots = _slots(cfg)
    assert sorted(slots) == ["judge-0", "judge-1", "rm-0", "rm-1", "rm-off-0", "rm-off-1"]
    modes = {n: s["determinism"] for n, s in slots.items()}
    assert modes == {
        "judge-0": "auto",
        "judge-1": "auto",
        "rm-0": "auto",
        "rm-1": "auto",
        "rm-off-0": "off",
        "rm-off-1": "off",
    }
    for name, spec in slots.items():
        assert spec["engine_args"] == (ENGINE_GPU if gpu else ENGINE), name


def test_the_gpu_run_fits_one_gpu_and_builds_its_models_on_the_device():
    slots = _slots(config(Path("/m"), gpu=True))
    assert sum(s["ray_actor_options"]["num_gpus"] for s in slots.values()) <= 1.0
    assert all(s["engine_args"]["kv_cache_memory_bytes"] > 0 for s in slots.values())
    assert all(s["engine_env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" for s in slots.values())
    paths = {n: s["model_path"] for n, s in slots.items()}
    # the off control runs the very model the auto DisRM slots run: one variable, the mode
    assert paths["rm-off-0"] == paths["rm-0"] == "/m/rm-0.5b"
    assert paths["judge-0"] == "/m/grm-0.5b"
    cpu = _slots(config(Path("/m")))
    assert "num_gpus" not in (cpu["rm-0"].get("ray_actor_options") or {})
    assert cpu["rm-off-0"]["model_path"] == "/m/disrm-large"


def test_experimental_switches_live_in_their_own_section():
    """``load_weight`` and ``class_queue`` exist to reproduce the benchmark's controls: set at
    ``gateway`` they are refused with the section they belong in, set there they apply."""
    with pytest.raises(ValidationError, match="class_queue: set under gateway.experimental"):
        GatewaySettings.model_validate({"class_queue": False})
    settings = GatewaySettings.model_validate({"experimental": {"class_queue": False}})
    assert settings.experimental.class_queue is False
    assert GatewaySettings().experimental.load_weight == "answer_time"
