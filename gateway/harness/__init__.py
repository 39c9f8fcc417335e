"""Start, watch and stop a local rmgate and the processes it starts, from a script or a test.

The test suite and the benchmarks share this code, so it lives in the installed package and
both import it normally (``from gateway.harness.running import running_gateway``) instead
of one importing the other's files. It runs without pytest (the GPU benchmarks run it on a
GPU host as is) and imports no vLLM; nothing on the serving path imports it.

* ``processes``: find the processes a gateway started (by a marker in their environment,
  by process group, the engine launcher on a port) and end them by id;
* ``running``: ``rmgate serve`` on a free port, waiting until every slot serves, the Ray
  dashboard it printed, a Prometheus total;
* ``slowdowns``: make engines slow (SIGSTOP duty cycles, a CPU cgroup quota) and read the
  niceness Ray gives its workers;
* ``cpu_accounting``: CPU seconds by component and by process group, from ``/proc``;
* ``cluster``: a Ray cluster of several nodes on this one machine, and rmgate served on it;
* ``least_loaded``: the least-loaded FastAPI + httpx proxy rmgate is measured against;
* ``otlp_receiver``: an in-memory OTLP/HTTP trace receiver (what rmgate and vLLM export).
"""
