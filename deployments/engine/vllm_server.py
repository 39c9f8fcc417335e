"""vLLM's OpenAI server, with its inter-process busy-wait bounded on CPU hosts (and, under
``fixed_shape``, the score head and ``lm_head`` at one row count and attention in one
split: ``deployments.engine.fixed_shape``).

vLLM's engine processes talk over a shared-memory queue whose reader spins
(``sched_yield``) for one second after every message before it sleeps on a socket
(``SpinCondition.busy_loop_s``, hard-coded in vLLM 0.32; vLLM #19036, #52814). A GPU host
can spare that core. On a CPU host the cores are the engines' compute: an engine answering
a request every 250 ms spins without pause, so two lightly loaded engines hold both cores
of a 2-core host, and an engine booting beside them took 2.3 minutes instead of 40 s.
``RMGATE_ENGINE_SPIN_S`` (set by ``deployments.engine.args`` on CPU: 2 ms) bounds the spin;
a message arriving later wakes the reader through the socket instead (tens of
microseconds). vLLM says that socket can lose a wake-up: a sleeping reader re-reads the
queue every 5 s to recover (``SHM_READER_RECHECK_INTERVAL_MS``), which a one-second spin
hides and a 2 ms one does not (measured: one judge request in 8 took 5.1 s instead of
0.1 s). So the bound also shortens that re-read to ``RECHECK_MS``: a sleeping reader looks
at the queue 50 times a second, which costs nothing measurable. The queue carries the same
messages either way: the answers' bits do not depend on it.

    python -m deployments.engine.vllm_server [vLLM server arguments]
"""

from __future__ import annotations

import os

from deployments.engine.fixed_shape import one_split_attention, pad_head_rows

#: The environment variable that bounds the busy-wait (seconds); unset: vLLM's own.
SPIN_ENV = "RMGATE_ENGINE_SPIN_S"
#: How often a sleeping reader re-reads the queue when the spin is bounded (vLLM: 5,000).
RECHECK_MS = 20


def bound_busy_wait() -> float | None:
    """Make ``SpinCondition`` readers spin at most ``$RMGATE_ENGINE_SPIN_S`` seconds (in
    this process and the engine processes it forks). Returns the bound, None when unset."""
    value = os.environ.get(SPIN_ENV)
    if not value:
        return None
    seconds = float(value)
    from vllm.distributed.device_communicators import shm_broadcast

    init = shm_broadcast.SpinCondition.__init__
    defaults = init.__defaults__ or ()
    if len(defaults) != 1:  # another vLLM: its own wait, untouched
        return None
    init.__defaults__ = (seconds,)
    if hasattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS"):  # read at each wait
        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS
    return seconds


bound_busy_wait()  # at import: spawned engine processes import this module as their main
pad_head_rows()  # fixed_shape's score head and lm_head at one row count (RMGATE_FIXED_HEAD_ROWS)
one_split_attention()  # fixed_shape's attention in one split (RMGATE_ATTENTION_ONE_SPLIT)


def run_server() -> None:
    """vLLM's OpenAI server: its launcher where vLLM has one (0.32), else the OpenAI server
    module's own main (0.24, the GPU image), run as ``python -m`` would, with this module
    kept as ``__main__``: engine processes vLLM spawns import ``__main__`` again, and this
    one bounds their spin."""
    try:
        from vllm.entrypoints.launchers.api_server.entry import main
    except ImportError:
        import runpy

        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
        return
    main()


if __name__ == "__main__":
    run_server()
