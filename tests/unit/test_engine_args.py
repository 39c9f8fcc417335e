"""engine_args names: rmgate's own options refused at load, unknown ones against vLLM.

The checks against vLLM read the installed server's parser once per test process (a child
process importing vLLM: several seconds); the tests that simulate a missing vLLM come last
and restore the cache afterwards.
"""

from __future__ import annotations

import copy
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deployments.engine import arg_names
from deployments.engine.arg_names import (
    EngineArgumentError,
    UnknownEngineArgument,
    check_engine_args,
    known_engine_arg_names,
)
from deployments.engine.args import Platform, PolicyError, plan_engine
from gateway.core.config.settings import OWNED_ENGINE_ARGS, AppConfig, ModelSpec
from gateway.serve import topology

REPO = Path(__file__).resolve().parents[2]
CPU = Platform("cpu", "cpu")
H200 = Platform("cuda", "NVIDIA H200", (9, 0))


def spec(**kw: Any) -> ModelSpec:
    return ModelSpec(**{"name": "m", "kind": "discriminative", "model_path": "/x", **kw})


def compact(engine_args: dict[str, Any]) -> dict[str, Any]:
    return {
        "applications": [
            {
                "name": "rmgate",
                "route_prefix": "/",
                "import_path": topology.COMPACT_IMPORT,
                "args": {
                    "models": [
                        {
                            "name": "rm",
                            "kind": "discriminative",
                            "model_path": "/m/rm",
                            "replicas": 2,
                        },
                        {
                            "name": "judge",
                            "kind": "generative",
                            "model_path": "/m/grm",
                            "engine_args": engine_args,
                        },
                    ]
                },
            }
        ]
    }


# --- owned names: pure, in ModelSpec ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OWNED_ENGINE_ARGS))
@pytest.mark.parametrize("dashes", [False, True])
def test_owned_names_refused_in_both_spellings_with_the_reason(name: str, dashes: bool):
    key = name.replace("_", "-") if dashes else name
    with pytest.raises(ValidationError, match=re.escape(OWNED_ENGINE_ARGS[name])) as err:
        spec(engine_args={"dtype": "float32", key: "x"})
    assert f"engine_args.{key}" in str(err.value)


def test_the_core_owned_names_are_there_with_the_port_reason():
    assert {"model", "served_model_name", "host", "port", "runner"} <= set(OWNED_ENGINE_ARGS)
    with pytest.raises(
        ValidationError,
        match=re.escape("rmgate sets `port` itself (one engine per slot on a free loopback port)"),
    ):
        spec(engine_args={"port": 8001})


def test_every_config_path_refuses_them():
    with pytest.raises(ValidationError, match="served_model_name"):
        AppConfig.model_validate(
            {
                "models": [
                    {
                        "name": "a",
                        "kind": "generative",
                        "model_path": "/x",
                        "engine_args": {"served-model-name": "b"},
                    }
                ]
            }
        )
    with pytest.raises(ValidationError, match="`host` itself"):
        topology.render(compact({"host": "0.0.0.0"}))


def test_dashes_are_normalized_and_a_name_twice_is_refused():
    s = spec(engine_args={"max-model-len": 512, "--enforce-eager": True, "dtype": "float32"})
    assert s.engine_args == {"max_model_len": 512, "enforce_eager": True, "dtype": "float32"}
    args = plan_engine(s, CPU, port=9).args
    assert args[args.index("--max-model-len") + 1] == "512" and "--enforce-eager" in args
    with pytest.raises(ValidationError, match="`max_model_len` twice"):
        spec(engine_args={"max-model-len": 512, "max_model_len": 1024})


def test_plan_engine_never_lets_engine_args_override_owned_options():
    """Defence in depth: a spec edited after validation (or built without it)."""
    s = spec()
    s.engine_args["port"] = 1
    with pytest.raises(PolicyError, match="`port` itself"):
        plan_engine(s, CPU, port=9)
    raw = ModelSpec.model_construct(
        name="m", kind="generative", model_path="/x", engine_args={"served-model-name": "other"}
    )
    with pytest.raises(PolicyError, match="served_model_name"):
        plan_engine(raw, H200, port=9)


# --- names against the installed vLLM ----------------------------------------------------


def test_unknown_name_refused_with_the_closest_known_one():
    with pytest.raises(
        UnknownEngineArgument,
        match=r"`max_model_length` \(did you mean "
        r"`max_model_len`",
    ) as err:
        check_engine_args(spec(engine_args={"max_model_length": 512, "dtype": "float32"}))
    assert err.value.model == "m" and list(err.value.unknown) == ["max_model_length"]
    assert "max_model_len" in err.value.unknown["max_model_length"]
    assert isinstance(err.value, ValueError)


def test_several_unknown_names_and_negated_spellings_are_listed():
    with pytest.raises(UnknownEngineArgument) as err:
        check_engine_args(
            spec(engine_args={"dtyp": "float32", "no_enable_prefix_caching": True, "qqqzzz": 1})
        )
    assert set(err.value.unknown) == {"dtyp", "no_enable_prefix_caching", "qqqzzz"}
    assert err.value.unknown["dtyp"][0] == "dtype"
    assert err.value.unknown["no_enable_prefix_caching"] == ["enable_prefix_caching: false"]
    assert err.value.unknown["qqqzzz"] == []


def test_false_for_a_flag_without_a_no_form_is_refused():
    with pytest.raises(EngineArgumentError, match="no --no-disable-log-stats"):
        check_engine_args(spec(engine_args={"disable_log_stats": False}))
    check_engine_args(spec(engine_args={"disable_log_stats": True, "enforce_eager": False}))


def test_frontend_options_and_everything_rmgate_emits_are_known():
    """The list is the server's parser, not only AsyncEngineArgs: frontend options too.
    And every flag plan_engine itself writes (in every mode) must be one vLLM accepts."""
    known = known_engine_arg_names()
    assert {
        "disable_uvicorn_access_log",
        "attention_backend",
        "max_model_len",
        "kv_cache_memory_bytes",
    } <= known
    assert "help" not in known and "model_tag" not in known  # no --model-tag flag
    owned_flags = set(OWNED_ENGINE_ARGS) - {"config", "uds", "headless", "grpc"}
    assert owned_flags <= known  # rmgate's own options are real vLLM options
    for platform, mode in ((CPU, "serialize"), (H200, "batch_invariant"), (CPU, "off")):
        for kind in ("generative", "discriminative"):
            plan = plan_engine(spec(kind=kind, determinism=mode), platform, port=9)
            flags = {a[2:].replace("-", "_") for a in plan.args if a.startswith("--")}
            flags = {f[3:] if f.startswith("no_") and f[3:] in known else f for f in flags}
            assert flags <= known, (mode, kind, flags - known)


def _shipped_models() -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, model dict) of every model in the shipped configs and benchmark configs."""
    files = sorted((REPO / "configs").glob("*.yaml")) + sorted(
        (REPO / "benchmarks" / "configs").glob("*.yaml")
    )
    configs = [(str(f.relative_to(REPO)), yaml.safe_load(f.read_text())) for f in files]
    from benchmarks.gpu import bench_gpu

    paths = {"generative": Path("/m/grm"), "discriminative": Path("/m/rm")}
    configs += [
        (f"bench_gpu.serve_config({d!r})", bench_gpu.serve_config(d, paths))
        for d in ("cpu", "cuda")
    ]
    for where, cfg in configs:
        for application in cfg["applications"]:
            if application.get("import_path") in {topology.COMPACT_IMPORT}:
                for model in application["args"]["models"]:
                    yield where, model


def test_every_shipped_config_uses_known_engine_args():
    found = list(_shipped_models())
    assert {w for w, _ in found} >= {
        "configs/gpu.yaml",
        "configs/demo-cpu.yaml",
        "benchmarks/configs/hops.yaml",
        "bench_gpu.serve_config('cuda')",
    }
    keys = set()
    for where, raw in found:
        model = ModelSpec.model_validate(raw)  # owned names: none
        check_engine_args(model)
        keys |= set(model.engine_args)
    assert {"dtype", "max_model_len", "attention_backend", "kv_cache_memory_bytes"} <= keys


def test_render_refuses_a_typo_before_anything_starts(monkeypatch: pytest.MonkeyPatch):
    built: list[str] = []
    real = topology.ingress_app
    monkeypatch.setattr(topology, "ingress_app", lambda *a: built.append("ingress") or real(*a))
    with pytest.raises(UnknownEngineArgument, match="`max_model_length`.*`max_model_len`"):
        topology.render(compact({"max_model_length": 512}))
    assert built == []  # refused before the first application is built
    assert len(topology.render(compact({"max-model-len": 512}))["applications"]) == 4


def test_rmgate_render_cli_refuses_a_typo(tmp_path: Path):
    from typer.testing import CliRunner

    from gateway.cli.main import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(compact({"max_model_length": 512})))
    result = CliRunner().invoke(app, ["render", str(bad)])
    assert result.exit_code == 2, result.output  # a usage error with the reason, no traceback
    assert "max_model_len" in result.output


def test_rmgate_serve_refuses_a_typo_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``rmgate serve`` renders (and so checks) before ``ray.init``: nothing starts."""
    import ray
    from typer.testing import CliRunner

    from gateway.cli.main import app

    def no_ray(*a, **k):
        raise AssertionError("ray.init must not be reached with a bad config")

    monkeypatch.setattr(ray, "init", no_ray)
    for name in ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_ENABLE_DIRECT_INGRESS"):
        monkeypatch.setenv(name, "0")  # the CLI sets them; restored after the test
    config = compact({"max_model_length": 512})
    for model in config["applications"][0]["args"]["models"]:  # folders that exist
        folder = tmp_path / model["name"]
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        model["model_path"] = str(folder)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["serve", str(bad), "--proxy", "serve"])
    assert result.exit_code == 2, result.output
    assert "max_model_len" in result.output


# --- without vLLM: skipped with a warning (these come last: they reset the cache) --------


def test_check_skipped_with_a_warning_where_vllm_is_not_importable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setattr(arg_names, "_CACHE", None)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError):
        known_engine_arg_names()
    with caplog.at_level(logging.WARNING, logger="rmgate"):
        check_engine_args(spec(name="rm", engine_args={"max_model_length": 512}))
        rendered = topology.render(compact({"max_model_length": 512}))
    assert len(rendered["applications"]) == 4
    assert "'rm'" in caplog.text and "not checked against vLLM" in caplog.text
    assert "not installed" in caplog.text
    assert arg_names._CACHE is None  # nothing was probed


def test_check_skipped_with_a_warning_where_vllm_fails_to_import(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """vLLM installed but broken (or its parser moved): the child's error, once, cached."""
    monkeypatch.setattr(arg_names, "_CACHE", None)
    monkeypatch.setattr(arg_names, "_PROBE", "raise ImportError('no module named vllm._C')")
    with caplog.at_level(logging.WARNING, logger="rmgate"):
        check_engine_args(spec(engine_args={"max_model_length": 512}))
    assert "vllm._C" in caplog.text and "not checked" in caplog.text
    assert isinstance(arg_names._CACHE, arg_names.VllmArgsUnavailable)
    monkeypatch.setattr(arg_names, "_PROBE", "raise SystemExit('must not run again')")
    with pytest.raises(ImportError, match="vllm._C"):
        known_engine_arg_names()


def test_engine_args_is_still_a_plain_dict_copy():
    """Normalizing never aliases the caller's dict (configs are reused across renders)."""
    raw = {"max-model-len": 64}
    s = spec(engine_args=raw)
    assert raw == {"max-model-len": 64} and s.engine_args == {"max_model_len": 64}
    assert copy.deepcopy(s).engine_args == s.engine_args


def test_tensor_parallel_slots_get_collectives_that_do_not_follow_the_batch():
    """TP > 1 under a deterministic mode: NCCL's algorithm and protocol pinned, vLLM's
    size-dependent custom all-reduce off (an engine_args override is not taken); `off`
    keeps vLLM's defaults. The settings are in the plan's env, hence in the identity."""
    from deployments.engine.args import TP_DETERMINISM_ENV

    gpu = Platform("cuda", "NVIDIA H200", (9, 0))
    args = {"dtype": "bfloat16", "tensor_parallel_size": 2, "disable_custom_all_reduce": False}
    for mode in ("auto", "serialize", "off"):
        spec = ModelSpec(
            name="rm", kind="discriminative", model_path="/m", determinism=mode, engine_args=args
        )
        plan = plan_engine(spec, gpu, port=9000)
        pinned = all(plan.env.get(k) == v for k, v in TP_DETERMINISM_ENV.items())
        assert pinned == (mode != "off")
        assert ("--disable-custom-all-reduce" in plan.args) == (mode != "off")
    one = plan_engine(
        ModelSpec(
            name="rm", kind="discriminative", model_path="/m", engine_args={"dtype": "bfloat16"}
        ),
        gpu,
        port=9000,
    )
    assert "NCCL_ALGO" not in one.env and "--disable-custom-all-reduce" not in one.args


def test_cpu_engines_bound_the_busy_wait_and_gpu_engines_keep_vllms():
    """On CPU every plan (any mode) bounds vLLM's inter-process spin; a user's engine_env
    wins; GPU plans leave vLLM's own wait. The engine runs through the module that
    applies it, and the setting is not part of the numerics identity (no kernel reads it)."""
    from deployments.engine.args import CPU_ENGINE_SPIN_S
    from deployments.engine.numerics import KERNEL_ENV_PREFIXES
    from deployments.engine.process import EngineProcess
    from deployments.engine.vllm_server import SPIN_ENV

    for mode in ("auto", "off"):
        assert (
            plan_engine(spec(determinism=mode), CPU, port=9000).env[SPIN_ENV] == CPU_ENGINE_SPIN_S
        )
    assert SPIN_ENV not in plan_engine(spec(), H200, port=9000).env
    mine = plan_engine(spec(engine_env={SPIN_ENV: "0.5"}), CPU, port=9000)
    assert mine.env[SPIN_ENV] == "0.5"
    assert not SPIN_ENV.startswith(KERNEL_ENV_PREFIXES)
    engine = EngineProcess(plan_engine(spec(), CPU, port=9000), "127.0.0.1", 9000, "m-0")
    assert "deployments.engine.vllm_server" in engine.command()


def test_the_server_module_bounds_the_spin_in_the_engine_processes():
    """``bound_busy_wait`` changes the default of vLLM's SpinCondition (the readers' spin)
    and shortens a sleeping reader's re-read of the queue (the recovery from a lost
    wake-up), in a fresh interpreter as the engine starts it; unset, vLLM's 1 s and 5 s
    stay."""
    import subprocess

    code = (
        "from deployments.engine import vllm_server as v;"
        "from vllm.distributed.device_communicators import shm_broadcast as b;"
        "print(b.SpinCondition.__init__.__defaults__, b.SHM_READER_RECHECK_INTERVAL_MS)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "RMGATE_ENGINE_SPIN_S"}
    unset = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    bounded = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**env, "RMGATE_ENGINE_SPIN_S": "0.002"},
        capture_output=True,
        text=True,
    )
    assert unset.stdout.strip() == "(1,) 5000", unset.stderr[-2000:]
    assert bounded.stdout.strip() == "(0.002,) 20", bounded.stderr[-2000:]


def test_the_server_module_runs_vllms_server_on_old_and_new_vllm(monkeypatch):
    """vLLM 0.32's launcher where it exists; else (vLLM 0.24, the GPU image, which has no
    launcher package: its engines did not start with one) the OpenAI server module run as
    ``python -m`` would, without replacing ``__main__`` (spawned engine processes import
    this module again, and it bounds their spin)."""
    import runpy

    from vllm.entrypoints.launchers.api_server import entry

    from deployments.engine import vllm_server

    ran: list[object] = []
    monkeypatch.setattr(entry, "main", lambda: ran.append("launcher"))
    monkeypatch.setattr(runpy, "run_module", lambda name, **kw: ran.append((name, kw)))
    vllm_server.run_server()
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers.api_server.entry", None)
    vllm_server.run_server()
    assert ran == ["launcher", ("vllm.entrypoints.openai.api_server", {"run_name": "__main__"})]
