"""rmgate as a user installs it: a wheel, not an editable install, in a fresh venv.

The wheel is built from a copy of the checkout's files (tracked and untracked, not ignored:
what a commit would hold; a stale ``build/`` cannot leak into it) and installed with the
steps of scripts/install.sh, non-editable: ``torch==2.13.0`` first, then ``rmgate[cpu]``
from the wheel, then the CUDA torchvision/torchaudio/torchcodec removed. Then
``<venv>/bin/rmgate demo`` runs from an empty directory, with HOME pointed at a fresh
folder and the checkout nowhere on its path: it must build the demo models into the user
cache (~/.cache/rmgate/models/demo), serve the packaged demo config, answer /classify
and /v1/chat/completions, keep its own ports (HTTP, dashboard, HAProxy's frontend and the
ingress replicas' direct ports, the vLLM engines) on loopback, and leave no process behind
after Ctrl-C (SIGINT to its process group). Ray 2.60's own gRPC servers and HAProxy's
stats/metrics frontends listen on all interfaces whatever rmgate asks: reported, allowed.

The venv (under pytest's cache, .pytest_cache/d/rmgate-wheel-venv, made anew every run)
gets the test venv's third-party packages hard-linked in first, so the recipe's pip steps
find every dependency satisfied and install the wheel alone (~20 s; from scratch ~1 GB is
downloaded or taken from pip's cache and 3.7 GB written, ~2 min):
``RMGATE_WHEEL_TEST_FRESH=1`` makes it from scratch. The demo it serves is shared by this
module's tests: ``rmgate check`` of the demo as shipped, and ``/get_reward`` answers that
are byte-identical whichever slots answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deployments.engine.ports import fixed_port, listening_table, socket_inodes  # noqa: E402
from gateway.harness.processes import (
    alive,
    descendants,
    processes_with_env,
    running,
    stop_process_group,
    wait_until_gone,
)
from gateway.harness.running import printed_line, wait_until_serving

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: scripts/install.sh's steps, non-editable: (timing name, pip arguments). The cached venv
#: is keyed on them, so changing a step rebuilds it.
INSTALL_RECIPE = [
    ("pip_install_torch_s", ["install", "torch==2.13.0"]),
    ("pip_install_wheel_cpu_s", ["install", "{wheel}[cpu]"]),
    ("pip_uninstall_torchvision_s", ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"]),
]
INSTALL_TIMEOUT_S = 1800
START_TIMEOUT_S = 900
TEST_TIMEOUT_S = INSTALL_TIMEOUT_S + START_TIMEOUT_S + 300
#: Seconds each step took, printed at the end of the module (pytest -s shows them).
TIMINGS: dict[str, float] = {}


# -- building and installing ------------------------------------------------------------


def source_files() -> list[str]:
    """The checkout's files as a commit would hold them: tracked + untracked, not ignored."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"git ls-files failed in {REPO}: {exc}")
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if os.path.lexists(REPO / n)]  # not ones deleted in the tree


def copy_source(dst: Path) -> None:
    """Copy the source files to ``dst``; symlinks stay symlinks (as git stores them)."""
    for name in source_files():
        src, out = REPO / name, dst / name
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        elif src.is_file():
            shutil.copy2(src, out)


def run_logged(cmd: list[str], log: Path, timeout: float, **kwargs) -> None:
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, **kwargs)
    if proc.returncode:
        pytest.fail(
            f"{' '.join(cmd)} exited with {proc.returncode}:\n"
            f"{log.read_text(errors='replace')[-5000:]}"
        )


@contextmanager
def timed(name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    TIMINGS[name] = round(time.monotonic() - start, 1)


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a user who just made ``venv``: nothing points at the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "PYTHONPATH",
            "PYTHONHOME",
            "PYTHONSTARTUP",
            "VIRTUAL_ENV",
            "RMGATE_HOME",
            "XDG_CACHE_HOME",
            "RAY_ADDRESS",
            "RMGATE_STATE_DIR",
            "XDG_STATE_HOME",
        }
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.update(HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def make_venv(venv: Path, wheel: Path, log: Path, packages_from: Path | None = None) -> None:
    """python -m venv + the recipe: the same steps as scripts/install.sh, not editable.
    ``packages_from``: a site-packages whose packages are hard-linked in first."""
    shutil.rmtree(venv, ignore_errors=True)
    with timed("venv_create_s"):
        run_logged([sys.executable, "-m", "venv", str(venv)], log, 300)
    if packages_from is not None:
        with timed("packages_linked_s"):
            link_packages(packages_from, venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    for name, args in INSTALL_RECIPE:
        with timed(name):  # cwd outside the checkout; pip's cache and config as the user's
            run_logged(
                [*pip, *(a.format(wheel=wheel) for a in args)],
                log,
                INSTALL_TIMEOUT_S,
                cwd=log.parent,
                env=clean_env(venv),
            )


#: The test venv's own rmgate (editable, pointing at the checkout): never linked in.
EDITABLE_RMGATE = re.compile(r"^(__editable__.*rmgate.*|rmgate-.*\.dist-info)$")


def link_packages(site: Path, venv: Path) -> None:
    """Hard-link every entry of ``site`` into ``venv``'s site-packages, except the
    editable rmgate and what the new venv has already (pip, setuptools). Safe for the
    source: pip replaces a package by new files (uninstall moves, install writes anew),
    never by writing into an existing one."""
    dst = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    have = {p.name for p in dst.iterdir()}
    entries = [
        str(p)
        for p in sorted(site.iterdir())
        if p.name not in have and not EDITABLE_RMGATE.match(p.name) and p.name != "__pycache__"
    ]
    subprocess.run(["cp", "-al", *entries, str(dst)], check=True)


def clone_venv(venv: Path, wheel: Path, log: Path) -> None:
    """The recipe on a venv that already holds the test venv's third-party packages."""
    make_venv(venv, wheel, log, packages_from=Path(sysconfig.get_paths()["purelib"]))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The rmgate wheel, built from a copy of the checkout (``pip wheel --no-deps``)."""
    tmp = tmp_path_factory.mktemp("wheel")
    with timed("source_copy_s"):
        copy_source(tmp / "src")
    with timed("wheel_build_s"):
        run_logged(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-w",
                str(tmp / "dist"),
                str(tmp / "src"),
            ],
            tmp / "build.log",
            600,
            cwd=tmp,
        )
    built = list((tmp / "dist").glob("rmgate-*.whl"))
    assert len(built) == 1, built
    return built[0]


@pytest.fixture(scope="module")
def venv(wheel, request) -> Path:
    """A venv outside the checkout's packages with the wheel (not editable) and [cpu].

    By default its third-party packages are the test venv's own, hard-linked (seconds, no
    disk; ``clone_venv``), and the recipe's pip steps then find every dependency of
    ``rmgate[cpu]`` satisfied and install the wheel alone: the same packages a user's
    ``pip install rmgate[cpu]`` gets (scripts/install.sh made the test venv from the same
    pyproject), for ~20 s instead of ~2 min. ``RMGATE_WHEEL_TEST_FRESH=1``: a venv from
    scratch with the recipe (every package downloaded or taken from pip's cache)."""
    root = Path(request.config.cache.mkdir("rmgate-wheel-venv"))  # on the .venv's disk
    log, target = root / "install.log", root / "venv"
    log.write_text("")
    if os.environ.get("RMGATE_WHEEL_TEST_FRESH") == "1":
        make_venv(target, wheel, log)
    else:
        clone_venv(target, wheel, log)
    return target


def venv_python(venv: Path, code: str, cwd: Path, **env: str) -> str:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=cwd,
        env=clean_env(venv, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


# -- sockets ----------------------------------------------------------------------------

LOOPBACK = {
    "0100007F",
    "00000000000000000000000001000000",  # 127.0.0.1, ::1
    "0000000000000000FFFF00000100007F",
}  # ::ffff:127.0.0.1


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, local address in /proc/net hex, port) of every TCP socket in LISTEN state
    that one of ``pids`` holds."""
    table = listening_table()
    return sorted(
        {(pid, *table[inode]) for pid in pids for inode in socket_inodes(pid) if inode in table}
    )


def describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (torch, the object store) counted once overall."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def is_ray_process(cmdline: str) -> bool:
    """Ray's own processes: GCS, raylet, dashboard and agents, workers and actors."""
    return (
        cmdline.startswith("ray::")
        or "/ray/core/src/ray/" in cmdline
        or "site-packages/ray/" in cmdline
    )


def gateway_ports(http_port: int, engines: Path, driver_pid: int) -> dict[str, set[int]]:
    """The ports of this gateway, by kind: its HTTP port and Ray's dashboard, every vLLM
    engine (engine logs are named ``<model>-<slot>-<port>.log``), and the addresses in the
    HAProxy config Serve wrote for it: ``haproxy`` (the HTTP frontend, the ingress replicas'
    direct ports, the fallback proxy) and ``haproxy_admin`` (its stats and Prometheus
    frontends, which Ray 2.60's template binds on all interfaces: ``bind *:port``)."""
    ports: dict[str, set[int]] = {
        "http": {http_port, 8265},
        "haproxy": set(),
        "haproxy_admin": set(),
    }
    ports["engines"] = {
        int(p.stem.rsplit("-", 1)[1])
        for p in engines.glob("*.log")
        if p.stem.rsplit("-", 1)[-1].isdigit()
    }
    section = ""
    proxy_dir = Path(tempfile.gettempdir(), f"rmgate-proxy-{driver_pid}")  # gateway.cli's
    for cfg in sorted(proxy_dir.rglob("*")):  # HAProxy's config lies a folder down
        try:
            text = cfg.read_text(errors="replace") if cfg.is_file() else ""
        except OSError:
            continue
        if "\nfrontend " not in text:
            continue
        for line in text.splitlines():
            if re.match(r"(frontend|backend|listen|global|defaults)\b", line):
                section = line.strip()
            m = re.match(r"\s*(?:bind|server\s+\S+)\s+\S*?:(\d+)\b", line)
            if m:
                admin = section in ("frontend prometheus", "listen stats")
                ports["haproxy_admin" if admin else "haproxy"].add(int(m.group(1)))
    return ports


def check_loopback(
    listeners: list[tuple[int, str, int]], ports: dict[str, set[int]], driver_pid: int
) -> tuple[list[str], list[str]]:
    """(problems, known listeners beyond loopback). A problem: one of the gateway's serving
    ports (HTTP, dashboard, engines, HAProxy's frontend and servers) beyond loopback, or a
    process that is not Ray's (vLLM, an engine launcher, HAProxy) listening beyond it.
    Known and reported: Ray 2.60's core gRPC servers (GCS, raylet, every worker's and the
    driver's bind all interfaces whatever the node address), its agents, and HAProxy's
    stats/Prometheus frontends (bound ``*:port`` by Ray's template)."""
    strict = ports["http"] | ports["engines"] | ports["haproxy"]
    problems, known = [], []
    for pid, addr, port in listeners:
        if addr in LOOPBACK:
            continue
        cmd = describe(pid)
        where = f"{cmd[:120]} (pid {pid}) on {addr}:{port}"
        if port in strict:
            problems.append("gateway port: " + where)
        elif port in ports["haproxy_admin"] or is_ray_process(cmd) or pid == driver_pid:
            known.append(where)
        else:
            problems.append("not Ray's: " + where)
    return problems, known


# -- the tests --------------------------------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_wheel_ships_the_demo_config_and_installs_outside_the_checkout(wheel, venv, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        shipped = zf.read("gateway/serve/data/demo-cpu.yaml")
    assert shipped == (REPO / "configs" / "demo-cpu.yaml").read_bytes()  # content, not a link
    assert "gateway/cli/main.py" in names and "deployments/demo/models.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "configs/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    empty = tmp_path / "cwd"
    empty.mkdir()
    site = venv_python(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])", empty)
    where = json.loads(
        venv_python(
            venv,
            (
                "import json, gateway, gateway.cli.main as c, deployments;"
                "print(json.dumps([gateway.__file__, deployments.__file__, c.in_checkout(),"
                " str(c.demo_root())]))"
            ),
            empty,
            HOME=str(tmp_path / "home"),
        )
    )
    for module in where[:2]:
        assert Path(module).is_relative_to(site), (module, site)
        assert not Path(module).is_relative_to(REPO / "gateway"), module
    assert where[2] is False
    assert where[3] == str(tmp_path / "home" / ".cache" / "rmgate")
    # The other two places the demo models can go, in order of precedence.
    root = "import gateway.cli.main as c; print(c.demo_root())"
    assert venv_python(
        venv, root, empty, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg")
    ) == str(tmp_path / "xdg" / "rmgate")
    assert venv_python(
        venv, root, empty, XDG_CACHE_HOME=str(tmp_path / "xdg"), RMGATE_HOME=str(tmp_path / "mine")
    ) == str(tmp_path / "mine")
    # The packaged config is the one `rmgate demo` serves, and it is a regular file.
    config = venv_python(
        venv, ("import gateway.cli.main as c\nwith c.demo_config() as p: print(p)"), empty
    )
    assert Path(config).is_relative_to(site) and not Path(config).is_symlink(), config
    assert Path(config).read_bytes() == shipped
    assert not list(empty.iterdir())


@dataclass
class Demo:
    """A running ``<venv>/bin/rmgate demo`` (the shipped demo config, from the wheel)."""

    url: str
    port: int
    proc: subprocess.Popen
    venv: Path
    home: Path
    cwd: Path
    marker: str
    log: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def demo(venv, tmp_path_factory) -> Iterator[Demo]:
    """``rmgate demo`` from the wheel, run from an empty directory with an empty HOME; the
    module's tests share it. Stopped with Ctrl-C (SIGINT to its group) as a user would: it
    must exit 0 and leave no process behind."""
    tmp = tmp_path_factory.mktemp("demo")
    home, cwd = tmp / "home", tmp / "cwd"
    home.mkdir()
    cwd.mkdir()
    marker = str(tmp / "engines")  # every process the demo starts inherits it
    env = clean_env(venv, HOME=str(home), RMGATE_LOG_DIR=marker)
    port = fixed_port("127.0.0.1")  # bound later by Serve: outside the ephemeral range
    url = f"http://127.0.0.1:{port}"
    log = tmp / "demo.log"
    start = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(venv / "bin" / "rmgate"), "demo", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_serving(url, proc, log, START_TIMEOUT_S)
        TIMINGS["demo_start_s"] = round(time.monotonic() - start, 1)
        yield Demo(url, port, proc, venv, home, cwd, marker, log, env)
    finally:
        stop_start = time.monotonic()
        stop_process_group(proc)
        TIMINGS["demo_stop_s"] = round(time.monotonic() - stop_start, 1)
        left = wait_until_gone(marker)
        assert not left, f"processes left after shutdown: {[describe(p) for p in left]}"
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"rmgate demo exited with {proc.returncode}:\n{text[-3000:]}"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_demo_from_an_empty_directory_builds_into_the_user_cache(demo, tmp_path):
    from deployments.demo.models import demo_models_present

    url, port, marker, proc = demo.url, demo.port, demo.marker, demo.proc
    models = httpx.get(url + "/v1/models", timeout=30).json()
    assert {m["id"] for m in models["data"]} >= {"judge", "rm"}, models

    r = httpx.post(
        url + "/classify", json={"model": "rm", "input": ["2+3=5", "2+3=6"]}, timeout=120
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 2
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=120,
        json={
            "model": "judge",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Is 2+3=5 right?"}],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    # the group judge the demo prints a curl for: three answers compared, both orders
    line = printed_line(demo.log, "reward program pairwise")
    printed = demo.log.read_text(errors="replace")
    body = json.loads(line.split(" -d '", 1)[1].split("'", 1)[0])
    r = httpx.post(url + "/v1/rewards", json=body, timeout=300)
    assert r.status_code == 200, r.text
    comparisons = [d["components"][0]["comparisons"] for d in r.json()["details"]]
    assert all(len(c) == 4 for c in comparisons), comparisons  # 2 others x both orders
    assert None not in r.json()["rewards"], r.json()
    # sleep and wake are printed; `rmgate status` shows the judge autoscaled between 1 and 2
    assert "/sleep?level=1&model=judge" in printed and "/wake_up?model=judge" in printed
    status = subprocess.run(
        [str(demo.venv / "bin" / "rmgate"), "status", url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    rows = {r["model"]: r for r in json.loads(status.stdout)}
    assert rows["judge"]["autoscaling"] == "1..2" and rows["rm"]["autoscaling"] == "-"
    assert rows["rm"]["state"] == "awake" and rows["rm"]["ready"] == 2, rows
    # the audit runs within a minute of light traffic: re-answers on class mates, all same
    assert "/v1/audit" in printed
    for i in range(8):
        httpx.post(url + "/classify", json={"model": "rm", "input": f"{i}+{i}="}, timeout=120)
    audit: dict = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        audit = httpx.get(url + "/v1/audit", timeout=30).json()
        if sum(c["same"] for c in audit["classes"]) >= 1:
            break
        time.sleep(2)
    assert audit["enabled"] and sum(c["same"] for c in audit["classes"]) >= 1, audit
    assert not any(c["different"] for c in audit["classes"]) and not audit["drained"], audit
    # the demo's engines checked their prefix cache at start-up and serve as it found (with
    # it on AVX-512 hosts, without it where warm answers differ: AVX2-only AMD hosts)
    cards = {m["id"]: m for m in models["data"]}
    reports = [p for m in ("judge", "rm") for p in cards[m]["prefix_cache"]]
    assert reports and all(p and p["enabled"] is p["check"]["passed"] for p in reports), reports

    listeners = listening_sockets(processes_with_env(marker))
    ours = gateway_ports(port, Path(marker), proc.pid)
    problems, known = check_loopback(listeners, ours, proc.pid)
    bound = {p for _, _, p in listeners}
    TIMINGS["demo_pss_gib"] = round(
        sum(pss_bytes(pid) for pid in processes_with_env(marker)) / 2**30, 1
    )
    (tmp_path / "listeners.json").write_text(
        json.dumps(  # for the record
            {
                "ports": {k: sorted(v) for k, v in ours.items()},
                "listeners": [(describe(pid)[:160], addr, p) for pid, addr, p in listeners],
            },
            indent=1,
        )
    )
    text = demo.log.read_text(errors="replace")
    built = demo.home / ".cache" / "rmgate" / "models" / "demo"
    assert f"building demo models in {built} ..." in text, text[-3000:]
    assert demo_models_present(built)
    assert not list(demo.cwd.iterdir()), list(demo.cwd.iterdir())  # nothing written there
    # Loopback only, for everything rmgate opens.
    assert port in bound and len(ours["engines"] & bound) >= 4, (ours, listeners)  # judge x2, rm x2
    assert ours["haproxy"] or "HTTP path: serve" in text, ours  # HAProxy's, where it runs
    assert not problems, "listening beyond loopback:\n" + "\n".join(problems)
    # Every engine answers only its gateway: 401 without its slot's secret, /health open.
    for engine in sorted(ours["engines"] & bound):
        base = f"http://127.0.0.1:{engine}"
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        for path in ("/classify", "/v1/chat/completions", "/v1/models", "/tokenize"):
            r = httpx.post(base + path, json={"model": "rm", "input": "x"}, timeout=30)
            assert r.status_code == 401, (engine, path, r.status_code, r.text)
    TIMINGS["known_listeners_beyond_loopback"] = len(known)
    print(
        "\nknown listeners beyond loopback (Ray 2.60's gRPC servers and agents, HAProxy "
        "stats/metrics):\n  " + "\n  ".join(known),
        flush=True,
    )


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_rmgate_check_of_the_shipped_demo_says_identical(demo):
    """The README's proof, exactly as a new user runs it: ``rmgate check URL`` with its
    defaults against the demo as shipped (``placement: class``: a key may be answered by
    either slot of its class). The verdict compares bits, seed and class, not the slot:
    IDENTICAL, exit 0, with both slots used (the verifier that counted a moved key as a
    difference said DIFFERENT here). Its negative control (a plain ``off`` engine, and
    ``--against`` it): tests/integration/test_negative_control.py."""
    out = subprocess.run(
        [str(demo.venv / "bin" / "rmgate"), "check", demo.url],
        cwd=demo.cwd,
        env=demo.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "VERDICT: IDENTICAL" in out.stdout, out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("A c=")]
    assert len(rows) == 2 and all(row[-2] == "0,1" for row in rows), out.stdout
    print("\n" + out.stdout, flush=True)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_get_reward_answers_are_byte_identical_whichever_slots_answer(demo):
    """OpenRLHF logs ``extra_logs`` as training metrics: two identical batches must give
    the same bytes even when class placement spreads their items over other slots (seen
    in ``x-rmgate-slot``, one slot per item). The batch is sent several times, one batch
    alone and two at once, until two runs were answered by different slots."""
    queries = [
        f"<s>{a}+{b}={(a + b + k) % 19}</s>" for a in range(4) for b in range(4) for k in (0, 1, 2)
    ]
    body = {"query": queries, "prompts": [q[3:7] for q in queries], "labels": [None] * 48}

    async def batch(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=600) as client:
            # cache off: each batch computed again (a hit would name the recorded slots)
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            demo.url + "/get_reward", json=body, headers={"x-rmgate-cache": "off"}
                        )
                        for _ in range(n)
                    )
                )
            )

    answers: list[httpx.Response] = []
    for n in (1, 2, 2, 2, 2):
        answers += asyncio.run(batch(n))
        if len({r.headers["x-rmgate-slot"] for r in answers}) > 1:
            break
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers][:2]
    slots = {r.headers["x-rmgate-slot"] for r in answers}
    assert len(slots) > 1, "every run was answered by the same slots: not a test"
    assert len({r.content for r in answers}) == 1  # the whole body, byte for byte
    extra = json.loads(answers[0].content)["extra_logs"]
    assert set(extra) == {"parsed"} and len(extra["parsed"]) == 48
    print(f"\n/get_reward: {len(answers)} identical answers from {len(slots)} slot layouts")


def engine_requests_done(url: str, model: str) -> float:
    """The engine calls the test's requests made: the engines' count less the demo's
    continuous audit's re-answers."""
    from gateway.harness.processes import requests_done_besides_audits

    return requests_done_besides_audits(url, [model])


def ingress_pids(marker: str) -> list[int]:
    """The gateway's ingress replica processes (Ray names them ``ServeReplica:...gateway``)."""
    out = []
    for pid in processes_with_env(marker):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "ServeReplica" in cmd and cmd.split("ServeReplica", 1)[1].rstrip("\0 ").endswith(
            "gateway"
        ):
            out.append(pid)
    return out


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_ledger_answers_repeats_once_and_survives_kill_9(demo):
    """The demo's defaults: cache on, SQLite under the user's state directory.

    * 48 judge + 48 DisRM requests answered fresh (``x-rmgate-cache: off``), then again
      with the cache: every one a hit, bitwise the fresh answer, no engine call;
    * a burst of 64 identical new requests makes one engine call (counted by the engines);
    * ``kill -9`` of the ingress under load: the file passes ``integrity_check`` and holds
      every row flushed before the kill; the restarted ingress answers hits from it."""
    import signal
    import sqlite3

    from gateway.core.api.answers import answer_of

    db = demo.home / ".local" / "state" / "rmgate" / "ledger.sqlite3"
    judge = [
        {
            "model": "judge",
            "max_tokens": 6,
            "messages": [{"role": "user", "content": f"ledger {i}: is {i}+1={i + 1}?"}],
        }
        for i in range(48)
    ]
    disrm = [{"model": "rm", "input": f"ledger {i}: {i}+1={i + 2}"} for i in range(48)]
    calls = [("/v1/chat/completions", b) for b in judge] + [("/classify", b) for b in disrm]

    async def send(pairs, headers=None, concurrency=16) -> list[httpx.Response]:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=600, base_url=demo.url) as client:

            async def one(path, body):
                async with sem:
                    return await client.post(path, json=body, headers=headers)

            return list(await asyncio.gather(*(one(p, b) for p, b in pairs)))

    fresh = asyncio.run(send(calls, {"x-rmgate-cache": "off"}))
    assert all(r.status_code == 200 for r in fresh), [r.text for r in fresh][:2]
    engines_before = engine_requests_done(demo.url, "judge") + engine_requests_done(demo.url, "rm")
    cached = asyncio.run(send(calls))
    assert [r.headers.get("x-rmgate-cache") for r in cached] == ["hit"] * len(calls)
    assert [r.content for r in cached] == [r.content for r in fresh]
    assert [r.headers["x-rmgate-receipt"] for r in cached] == [
        r.headers["x-rmgate-receipt"] for r in fresh
    ]
    assert (
        engine_requests_done(demo.url, "judge") + engine_requests_done(demo.url, "rm")
        == engines_before
    )

    burst = {"model": "rm", "input": "one call for sixty-four asks"}
    before = engine_requests_done(demo.url, "rm")
    answers = asyncio.run(send([("/classify", burst)] * 64, concurrency=64))
    assert all(r.status_code == 200 for r in answers)
    assert len({r.content for r in answers}) == 1
    assert engine_requests_done(demo.url, "rm") - before == 1
    assert {r.headers["x-rmgate-cache"] for r in answers} <= {"hit", "miss", "shared"}

    # the first asker's client leaves (its call leads the flight): the others still get it
    ask = {
        "model": "judge",
        "max_tokens": 48,
        "messages": [
            {"role": "user", "content": "a long answer that the first asker stops waiting for"}
        ],
    }

    async def leader_leaves() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=600, base_url=demo.url) as client:

            async def impatient() -> None:
                try:
                    await client.post("/v1/chat/completions", json=ask, timeout=0.15)
                except httpx.TimeoutException:
                    pass

            first = asyncio.create_task(impatient())
            await asyncio.sleep(0.05)
            rest = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=ask) for _ in range(3))
            )
            await first
            return list(rest)

    rest = asyncio.run(leader_leaves())
    assert [r.status_code for r in rest] == [200] * 3, [r.text for r in rest]
    assert len({r.content for r in rest}) == 1

    # kill -9 of the ingress while it records
    time.sleep(1.0)  # everything above flushed (interval 0.2 s)
    with sqlite3.connect(db) as conn:
        flushed = {row[0] for row in conn.execute("SELECT identity FROM rewards")}
    assert {r.headers["x-rmgate-receipt"] for r in fresh} <= flushed
    victims = ingress_pids(demo.marker)
    assert victims, "no ingress replica process found"
    more = [("/classify", {"model": "rm", "input": f"during the kill {i}"}) for i in range(40)]

    async def load_and_kill() -> None:
        async def kill() -> None:
            await asyncio.sleep(0.5)
            for pid in victims:
                os.kill(pid, signal.SIGKILL)

        await asyncio.gather(send(more, concurrency=4), kill(), return_exceptions=True)

    asyncio.run(load_and_kill())
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = {row[0] for row in conn.execute("SELECT identity FROM rewards")}
    assert flushed <= kept
    # the restarted ingress (Serve replaces the replica) answers hits from the file
    deadline = time.monotonic() + 180
    until_answered(lambda: httpx.post(demo.url + "/classify", json=disrm[0], timeout=30))
    assert not set(ingress_pids(demo.marker)) & set(victims)
    # a new ingress learns its slots' classes in its first seconds (until then a request
    # goes to an engine: nothing to name it by); then the file answers
    for (path, body), first in ((calls[len(judge)], fresh[len(judge)]), (calls[0], fresh[0])):
        again = httpx.post(demo.url + path, json=body, timeout=120)
        while again.headers.get("x-rmgate-cache") != "hit":
            assert answer_of(path, again.json()) == answer_of(path, first.json())  # same bits
            assert time.monotonic() < deadline, again.headers
            time.sleep(0.5)
            again = httpx.post(demo.url + path, json=body, timeout=120)
    hits = asyncio.run(send(calls))
    assert [r.headers["x-rmgate-cache"] for r in hits] == ["hit"] * len(calls)
    assert [r.content for r in hits] == [r.content for r in fresh]
    print(f"\nledger: {len(flushed)} rows flushed before the kill, {len(kept)} after it")


def until_answered(post: Callable[[], httpx.Response], timeout_s: float = 180) -> httpx.Response:
    """``post()``'s first 200 answer, retried while the ingress restarts."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = post()
            if answer.status_code == 200:
                return answer
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the ingress did not come back"
        time.sleep(1.0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_code_rewards_run_sandboxed_beside_the_models_and_die_with_the_ingress(demo):
    """The demo's ``code`` program (a ``code_tests`` rule in a bubblewrap sandbox):

    * right, wrong, crashing, looping, forking, hogging and flooding submissions are
      scored with each test's outcome;
    * a GRPO group of 16 identical submissions runs once (the rest shared or from the
      ledger);
    * while 24 bad submissions (fork bombs, loops, 10 GB allocations, 100 MB of output)
      run, DisRM requests answer the same scores, bit for bit, as before (their latency
      printed);
    * ``kill -9`` of the ingress mid-run leaves no sandboxed process behind."""
    import signal
    import statistics

    label = {"inputs": ["2\n", "5\n", "7\n"], "outputs": ["4", "10", "14"]}

    def item(code: str) -> dict:
        return {"prompt": "double it", "response": f"```python\n{code}\n```", "label": label}

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    codes = {
        "right": "print(int(input()) * 2)",
        "wrong": "print(4)",
        "crash": "raise ValueError('no')",
        "loop": "while True:\n    pass",
        "bomb": bomb,
        "hog": "x = bytearray(10 * 1024 ** 3)",
        "flood": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    }
    r = httpx.post(
        demo.url + "/v1/rewards",
        json={"model": "code", "items": [item(c) for c in codes.values()]},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    got = dict(zip(codes, r.json()["rewards"], strict=True))
    outcomes = {
        name: d["components"][0]["tests"]["counts"]
        for name, d in zip(codes, r.json()["details"], strict=True)
    }
    assert got["right"] == 1.0 and abs(got["wrong"] - 1 / 3) < 1e-12, (got, outcomes)
    assert outcomes["crash"] == {"runtime_error": 3}
    assert outcomes["loop"] == {"timeout": 3} and outcomes["bomb"] == {"timeout": 3}
    assert outcomes["hog"] == {"memory_limit": 3} and outcomes["flood"] == {"output_limit": 3}

    group = [item("n = int(input())\nprint(n + n)")] * 16
    g = httpx.post(demo.url + "/v1/rewards", json={"model": "code", "items": group}, timeout=600)
    assert g.status_code == 200 and g.json()["rewards"] == [1.0] * 16, g.text
    caches = [d["components"][0].get("cache") for d in g.json()["details"]]
    assert caches.count("miss") == 1 and set(caches) <= {"miss", "shared", "hit"}, caches

    disrm = [{"model": "rm", "input": f"{a}+{a}={2 * a}"} for a in range(8)]

    async def classify_all(client: httpx.AsyncClient) -> tuple[list[bytes], list[float]]:
        bodies, times = [], []
        for body in disrm:
            started = time.monotonic()
            one = await client.post("/classify", json=body, headers={"x-rmgate-cache": "off"})
            times.append(time.monotonic() - started)
            assert one.status_code == 200, one.text
            bodies.append(one.content)
        return bodies, times

    async def under_bad_code() -> tuple[tuple, tuple]:
        async with httpx.AsyncClient(timeout=600, base_url=demo.url) as client:
            quiet = await classify_all(client)
            bad = [item(codes[n]) for n in ("bomb", "loop", "hog", "flood", "bomb", "loop")]
            load = asyncio.gather(
                *(client.post("/v1/rewards", json={"model": "code", "items": [b]}) for b in bad * 4)
            )
            await asyncio.sleep(0.5)
            busy = await classify_all(client)
            answered = await load
            assert all(a.status_code == 200 for a in answered), [a.text for a in answered][:2]
            return quiet, busy

    quiet, busy = asyncio.run(under_bad_code())
    # the same scores, bit for bit, while bad code runs beside them
    assert [json.loads(b)["data"] for b in busy[0]] == [json.loads(b)["data"] for b in quiet[0]]
    print(
        f"\nDisRM latency: median {statistics.median(quiet[1]) * 1000:.0f} ms alone, "
        f"{statistics.median(busy[1]) * 1000:.0f} ms beside 24 bad submissions",
        flush=True,
    )

    # kill -9 of the ingress while a sandbox runs
    victims = ingress_pids(demo.marker)
    assert victims, "no ingress replica process found"
    slow = item("import time\ntime.sleep(3.5)\nprint(int(input()) * 2)")

    async def kill_mid_run() -> tuple[list[int], list[int]]:
        async with httpx.AsyncClient(timeout=600, base_url=demo.url) as client:
            request = asyncio.ensure_future(
                client.post(
                    "/v1/rewards",
                    json={"model": "code", "items": [slow]},
                    headers={"x-rmgate-cache": "off"},
                )
            )
            sandboxed: list[int] = []
            deadline = time.monotonic() + 60
            while not running(sandboxed, b"bwrap") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                sandboxed = descendants(victims)
            seen = running(sandboxed, b"bwrap")
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            await asyncio.gather(request, return_exceptions=True)
            return sandboxed, seen

    sandboxed, seen = asyncio.run(kill_mid_run())
    assert seen, "no sandbox was seen running"
    deadline = time.monotonic() + 20
    while alive(sandboxed):
        assert time.monotonic() < deadline, f"left behind: {alive(sandboxed)}"
        time.sleep(0.2)
    # the restarted ingress serves code rewards again
    again = until_answered(
        lambda: httpx.post(
            demo.url + "/v1/rewards",
            json={"model": "code", "items": [item(codes["right"])]},
            timeout=60,
        )
    )
    assert again.json()["rewards"] == [1.0]


def teardown_module() -> None:
    print(f"\nwheel install timings: {json.dumps(TIMINGS)}", flush=True)
