"""A Ray cluster of several nodes on this one machine, and rmgate served on it.

Ray runs several raylets on one machine; Ray's own test-cluster helper
(``ray.cluster_utils.Cluster``) starts them, in a process of their own (``main``), each
with its own custom resource (``{"nodeB": 1}``) so that a model's slots can be placed on a
chosen node (``slot_ray_actor_options``), and a node label (``rmgate-node: nodeB``) for
placement by ``label_selector``. Every node uses 127.0.0.1 (left to itself Ray
binds the machine's interface address). Each node
is started with a marker in its environment that every process it starts inherits (its
workers, the slot replicas, the engines), and its own engine log folder, so callers find a
node's processes and end them by pid (never ``ray stop``, which would end other clusters).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.engine.ports import fixed_port
from gateway.harness.processes import end_leftovers, processes_with_env, stop_process_group
from gateway.harness.running import REPO, wait_until_serving

#: The node label every node gets, its name: slots placed by ``label_selector`` use it.
NODE_LABEL = "rmgate-node"


@dataclass(frozen=True)
class Node:
    """One raylet: its custom resource (its name), marker and engine log folder."""

    name: str
    marker: str
    logs: Path

    def pids(self) -> list[int]:
        return processes_with_env(self.marker)

    def raylet_pids(self) -> list[int]:
        out = []
        for pid in self.pids():
            try:
                if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                    out.append(pid)
            except OSError:
                continue
        return out

    def lose(self) -> list[int]:
        """The node lost as a machine is: SIGKILL its raylet, then every process it
        started (workers, slot replicas, engines). Killing the raylet alone leaves its
        workers and their engines running a while (measured: a slot's engine on such a
        node still answered 25 s later), which is a raylet crash, not a lost node."""
        killed = []
        for pid in self.raylet_pids() + self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def engine_logs(self, model: str) -> list[Path]:
        """``<model>-<slot>-<port>.log`` of the engines this node started."""
        return sorted(self.logs.glob(f"{model}-*.log"))


def _serve_nodes(
    names: list[str], markers: list[str], workdir: Path, num_cpus: int, address_file: Path
) -> None:
    """This process: start the nodes with Ray's own test-cluster helper, write the GCS
    address, wait for SIGTERM/SIGINT, then shut every node down.

    Why not ``ray start``: the loopback switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    which keeps a node on 127.0.0.1 instead of the interface address) also makes ``ray
    start --address`` refuse to add a node; the helper starts nodes without that check."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every node on loopback
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(shutdown_at_exit=False)
    try:
        for i, (name, marker) in enumerate(zip(names, markers)):
            # what this node's raylet (and so every worker and engine it starts) inherits
            os.environ.update(RMGATE_TEST_NODE=marker, RMGATE_LOG_DIR=str(workdir / f"node-{name}"))
            cluster.add_node(
                num_cpus=num_cpus,
                resources={name: 1},
                labels={NODE_LABEL: name},
                node_ip_address="127.0.0.1",
                include_dashboard=False,
                object_store_memory=300 * 1024 * 1024,
                **(dict[str, Any](node_manager_port=0) if i else {}),
            )
        cluster.wait_for_nodes()
        partial = address_file.with_suffix(".partial")
        partial.write_text(cluster.address)
        os.replace(partial, address_file)  # the parent never reads half an address
        stop.wait()
    finally:
        cluster.shutdown()


def end_node(node: Node, timeout_s: float = 30) -> list[int]:
    """SIGTERM every process of the node, then SIGKILL what is left; returns those."""
    for pid in node.pids():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return end_leftovers(node.marker, timeout_s=timeout_s)


@contextmanager
def local_cluster(
    names: list[str], workdir: Path, num_cpus: int = 2, timeout_s: float = 180
) -> Iterator[tuple[str, dict[str, Node]]]:
    """(GCS address, nodes by name); the first name is the head. Ends every node by pid."""
    run = uuid.uuid4().hex[:8]
    nodes: dict[str, Node] = {}
    for name in names:
        logs = workdir / f"node-{name}"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        nodes[name] = Node(name, f"rmgate-node-{name}-{run}", logs)
    address_file = workdir / f"cluster-{run}.address"
    log = workdir / f"cluster-{run}.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
        "PYTHONPATH": str(REPO),
    }
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.harness.cluster",
                "--workdir",
                str(workdir),
                "--num-cpus",
                str(num_cpus),
                "--address-file",
                str(address_file),
                *[f"{n.name}={n.marker}" for n in nodes.values()],
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        if (
            not wait_for(lambda: address_file.exists() or proc.poll() is not None, timeout_s)
            or not address_file.exists()
        ):
            raise RuntimeError(f"the cluster did not start:\n{log.read_text()[-4000:]}")
        yield address_file.read_text().strip(), nodes
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for node in reversed(list(nodes.values())):
            end_node(node)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


@contextmanager
def rmgate_on_cluster(
    config: Path,
    address: str,
    workdir: Path,
    timeout_s: float = 900,
    proxy: str = "serve",
    routes: tuple[str, ...] = ("",),
) -> Iterator[str]:
    """``rmgate serve CONFIG --address ADDRESS`` on a free port; yields its URL. Stopping it
    (SIGINT) deletes its applications and leaves the cluster running.

    With ``--proxy-location HeadOnly``: these nodes share one address, so a proxy per node
    would bind the same port on it (the kernel then splits connections between the head's
    proxy and a worker's, and losing the worker drops the connections it held)."""
    port = fixed_port("127.0.0.1")  # bound later by Serve: outside the ephemeral range
    log = workdir / f"serve-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                str(config),
                "--port",
                str(port),
                "--address",
                address,
                "--proxy",
                proxy,
                "--proxy-location",
                "HeadOnly",
            ],
            cwd=REPO,
            env={**os.environ, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1"},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for route in routes:  # each gateway's route prefix
            wait_until_serving(url + route, proc, log, timeout_s)
        yield url
    finally:
        stop_process_group(proc)


def wait_for(predicate, timeout_s: float, every_s: float = 0.5) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return False


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(
        description="Run a local multi-node Ray cluster until SIGTERM (used by local_cluster)."
    )
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--address-file", type=Path, required=True)
    ap.add_argument("nodes", nargs="+", help="NAME=MARKER, the head first")
    args = ap.parse_args()
    names, markers = zip(*(n.split("=", 1) for n in args.nodes))
    _serve_nodes(list(names), list(markers), args.workdir, args.num_cpus, args.address_file)


if __name__ == "__main__":
    main()
