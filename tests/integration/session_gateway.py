"""The session's gateway (``rmgate serve configs/test-cpu.yaml``), started as soon as the
tests are collected, so that its boot (the demo models' build when the checkout has none,
Ray, Serve and five vLLM engines: minutes of CPU) overlaps the unit tests, which run first
(``tests/conftest.py`` orders them so) and leave a core free.

``start(config)`` is called from the collection hook when a selected test uses the
``gateway`` fixture, or from the fixture itself otherwise; it starts the throwaway
PostgreSQL server (the gateway's ledger) in this process and the gateway in a child that
first builds the demo models when they are missing (writing ``built`` next to its log when
they are there), then ``exec``s ``rmgate serve``. The fixtures adopt what it started:
``demo_models`` waits for ``built``; ``gateway`` waits until it serves.

    python -m tests.integration.session_gateway MODELS BUILT -- ARGV...   # the child
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "configs" / "test-cpu.yaml"
MODELS = REPO / "models" / "demo"


@dataclass
class SessionGateway:
    """What ``start`` started: the ledger's server and the (booting) gateway process."""

    postgres: object  # gateway.harness.postgres.ThrowawayPostgres
    proc: subprocess.Popen
    url: str
    log: Path
    env: dict[str, str]
    built: Path
    #: the ingress replicas' own port (``--direct-port``: Serve's proxy left out)
    direct_url: str

    def wait_built(self, timeout_s: float = 900.0) -> None:
        """Until the child has the demo models (or is gone: the caller then builds)."""
        deadline = time.monotonic() + timeout_s
        while not self.built.exists() and self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the session gateway's demo-model build did not finish")
            time.sleep(0.5)


STARTED = pytest.StashKey[SessionGateway]()


def start(config: pytest.Config) -> SessionGateway:
    """The session gateway, started once per session (the stashed one after that)."""
    if STARTED in config.stash:
        return config.stash[STARTED]
    from deployments.engine.ports import fixed_port
    from gateway.harness.postgres import ThrowawayPostgres

    postgres = ThrowawayPostgres()  # in the system's temp dir: the postgres user reaches it
    postgres.start()
    factory = getattr(config, "_tmp_path_factory", None)
    root = (
        factory.mktemp("rmgate")
        if factory is not None
        else Path(__import__("tempfile").mkdtemp(prefix="rmgate-session-"))
    )
    log = root / "serve.log"
    # bound later by Serve and the ingress: outside the ephemeral range, where no outgoing
    # connection can take them meanwhile
    port, direct_port = fixed_port("127.0.0.1"), fixed_port("127.0.0.1")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RMGATE_LOG_DIR": str(root / "engines"),
        "RMGATE_LEDGER_DSN": postgres.dsn,
    }
    serve = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        str(TEST_CONFIG),
        "--port",
        str(port),
        "--direct-port",
        str(direct_port),
    ]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.session_gateway",
                str(MODELS),
                str(root / "built"),
                "--",
                *serve,
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = SessionGateway(
        postgres,
        proc,
        f"http://127.0.0.1:{port}",
        log,
        env,
        root / "built",
        f"http://127.0.0.1:{direct_port}",
    )
    config.stash[STARTED] = started
    return started


def main() -> None:
    """The child: the demo models (when missing), then ``exec`` the gateway in this process
    (same pid and process group: the fixture's signals reach it)."""
    models, built = Path(sys.argv[1]), Path(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    from deployments.demo.models import build_demo_models, demo_models_present

    if not demo_models_present(models):
        print(f"session gateway: building the demo models in {models}", flush=True)
        build_demo_models(models)
    built.write_text("built\n")
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
