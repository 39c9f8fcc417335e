"""The ``code_tests`` rule's sandbox against what trainers do today (a plain subprocess per
test), side by side in one run: submissions and tests per second at several concurrencies,
the outcomes both give, and the sandbox's fixed cost per run.

The workload, generated here from ``random.Random(--seed)`` (nothing downloaded):
``--problems`` small competitive-programming problems of 14 families (sum of a list, max
subarray, primes below n, reverse words, Fibonacci mod m, sorting, gcd of pairs,
palindromes, the most frequent word, pairs summing to k, counts at most x, range sums,
balanced brackets, factorial mod p), each with 5-20 stdin/stdout tests whose expected
output a reference solution here computes, and one submitted response each: correct
(70 %), wrong (``--wrong-share``: an off-by-one or a wrong formula, some tests fail),
raising on some inputs (``--error-share``) or looping forever on one input
(``--loop-share``), in exact shares of the problems, shuffled.

Two arms, the same submissions, the same concurrency (``--concurrency``, each level in
turn), each submission's tests one after another as the sandbox runs them:

* ``sandbox``: every submission through ``gateway.sandbox.runner.CodeSandboxes`` (bwrap,
  a rule whose ``concurrency`` is the level), ``asyncio.gather`` under a semaphore of the
  level, per-test limits ``--cpu-s`` / ``--wall-s`` (the rest the rule's defaults);
* ``anchor``: each test as ``python -s -B -c CODE`` by ``asyncio.create_subprocess_exec``,
  the input on stdin, killed at ``--wall-s`` (``asyncio.wait_for``), its outcome by the
  harness's own ``classify`` (stdout judged by the same ``outputs_match``). The same
  interpreter as inside the sandbox (``LocalBackend(LocalSandbox()).python``) and the
  tests' fixed environment, so the sandbox is the one variable.

What differs besides the isolation, by design: sandboxed tests run at nice 10 and stop
at ``--cpu-s`` of CPU (``RLIMIT_CPU``), the anchor's at the wall clock only (a loop burns
``--wall-s`` of CPU there; ``--loop-share 0`` measures without loops; ``--anchor-nice 10``
nices the anchor's tests too). Arms alternate order at every level and round (anchor
first, then sandbox first...), so the host's drift hits both. Each submission's outcomes
must be the same in both arms, except a test that timed out or came near its limit
(``near_limit``: its outcome depends on the host's load) in either: disagreements are
printed and make the exit status 1 (after the result file is written).

Then the fixed cost, sequentially (``--overhead-runs`` each, arms alternating): a
one-test ``print(1)`` submission through the sandbox against the same test as a plain
subprocess; the difference of the medians is what one sandbox start costs (bwrap's
namespaces and mounts, the harness's own interpreter, the end-of-test sweep). With
``--overhead-tests K`` also a K-test ``print(1)`` submission against K plain runs: the
sandbox's cost per extra test.

    .venv/bin/python benchmarks/code_tests.py --problems 200 --concurrency 1,16,64 \\
        --rounds 2 --cpu-s 1 --wall-s 2 --wrong-share 0.2 --error-share 0.05 \\
        --loop-share 0.05 --anchor-nice 0 --overhead-runs 30 --overhead-tests 10 --seed 0 \\
        [--out benchmarks/reports/code_tests-DATE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.api.errors import RuleCheckFailed
from gateway.core.config.code_rules import CodeTestsRule, LocalSandbox, SandboxLimits
from gateway.core.scoring.base import CodeCall
from gateway.core.scoring.code_tests import submission
from gateway.sandbox.harness import TEST_ENV, classify
from gateway.sandbox.local import LocalBackend
from gateway.sandbox.runner import CodeSandboxes

REPO = Path(__file__).resolve().parents[1]

#: Outcomes whose verdict depends on the host's speed: never counted as a disagreement.
TIMING = ("timeout",)

WORDS = (
    "apple banana cherry delta echo fox golf hotel india juliet kilo lima mango "
    "nova oscar papa quebec romeo sierra tango"
).split()


# --- the problems -----------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A kind of problem: its inputs, the reference answer, a correct and a wrong
    submission (the wrong one fails some tests, not always all)."""

    name: str
    make_input: Callable[[random.Random], str]
    answer: Callable[[str], str]
    correct: str
    wrong: str


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def _sum_input(rng: random.Random) -> str:
    n = rng.randint(1, 50)
    a = [rng.randint(-1000, 1000) for _ in range(n)]
    if rng.random() < 0.2:
        a[0] = 0
    return f"{n}\n{' '.join(map(str, a))}\n"


def _maxsub_input(rng: random.Random) -> str:
    n = rng.randint(1, 30)
    top = -1 if rng.random() < 0.3 else 50
    return f"{n}\n{' '.join(str(rng.randint(-50, top)) for _ in range(n))}\n"


def _maxsub(text: str) -> str:
    a = _ints(text)[1:]
    best = cur = a[0]
    for x in a[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return str(best)


def _sieve(n: int) -> list[bool]:
    s = [True] * (n + 1)
    s[0] = s[1] = False
    for i in range(2, math.isqrt(n) + 1):
        if s[i]:
            for j in range(i * i, n + 1, i):
                s[j] = False
    return s


PRIMES = [p for p, yes in enumerate(_sieve(20000)) if yes]


def _primes_input(rng: random.Random) -> str:
    return f"{rng.choice(PRIMES) if rng.random() < 0.4 else rng.randint(2, 20000)}\n"


def _words_input(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10))) + "\n"


def _fib_input(rng: random.Random) -> str:
    return f"{rng.randint(0, 5000)} {rng.randint(2, 1000)}\n"


def _fib(text: str) -> str:
    n, m = _ints(text)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return str(a % m)


def _sort_input(rng: random.Random) -> str:
    n = rng.randint(1, 40)
    lo, hi = (0, 9) if rng.random() < 0.3 else (-10000, 10000)
    return f"{n}\n{' '.join(str(rng.randint(lo, hi)) for _ in range(n))}\n"


def _gcd_input(rng: random.Random) -> str:
    q = rng.randint(1, 8)
    lines = [str(q)]
    for _ in range(q):
        if rng.random() < 0.12:
            a, b = rng.randint(1, 10**6), rng.randint(1, 10**6)
        else:
            g = rng.randint(2, 1000)
            a, b = g * rng.randint(1, 1000), g * rng.randint(1, 1000)
        lines.append(f"{a} {b}")
    return "\n".join(lines) + "\n"


def _gcd(text: str) -> str:
    v = _ints(text)
    return "\n".join(str(math.gcd(v[1 + 2 * i], v[2 + 2 * i])) for i in range(v[0]))


def _palindrome_input(rng: random.Random) -> str:
    q = rng.randint(1, 6)
    lines = [str(q)]
    for _ in range(q):
        half = "".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 6)))
        s = half + half[::-1][rng.randint(0, 1) :] if rng.random() < 0.6 else half + "q"
        if rng.random() < 0.3:
            s = "".join(c.upper() if rng.random() < 0.5 else c for c in s)
        lines.append(s)
    return "\n".join(lines) + "\n"


def _palindrome(text: str) -> str:
    lines = text.split("\n")[1 : 1 + int(text.split("\n")[0])]
    return "\n".join("YES" if s.lower() == s.lower()[::-1] else "NO" for s in lines)


def _frequent_input(rng: random.Random) -> str:
    vocab = rng.sample(WORDS, rng.randint(2, 6))
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 20))) + "\n"


def _frequent(text: str) -> str:
    c = Counter(text.split())
    best = max(c.values())
    return min(w for w, k in c.items() if k == best)


def _pairs_input(rng: random.Random) -> str:
    n = rng.randint(1, 40)
    return f"{n} {rng.randint(0, 20)}\n{' '.join(str(rng.randint(0, 10)) for _ in range(n))}\n"


def _pairs(text: str) -> str:
    v = _ints(text)
    n, k, a = v[0], v[1], v[2:]
    return str(sum(1 for i in range(n) for j in range(i + 1, n) if a[i] + a[j] == k))


def _leq_input(rng: random.Random) -> str:
    n, q = rng.randint(1, 30), rng.randint(1, 10)
    a = [rng.randint(0, 100) for _ in range(n)]
    xs = [rng.choice(a) if rng.random() < 0.3 else rng.randint(-5, 105) for _ in range(q)]
    return f"{n} {q}\n{' '.join(map(str, a))}\n" + "".join(f"{x}\n" for x in xs)


def _leq(text: str) -> str:
    v = _ints(text)
    n, q = v[0], v[1]
    a = sorted(v[2 : 2 + n])
    return "\n".join(str(bisect_right(a, x)) for x in v[2 + n : 2 + n + q])


def _ranges_input(rng: random.Random) -> str:
    n, q = rng.randint(1, 30), rng.randint(1, 8)
    a = [rng.choice((0, rng.randint(-100, 100))) for _ in range(n)]
    queries = []
    for _ in range(q):
        left = rng.randint(1, n)
        queries.append(f"{left} {rng.randint(left, n)}\n")
    return f"{n} {q}\n{' '.join(map(str, a))}\n" + "".join(queries)


def _ranges(text: str) -> str:
    v = _ints(text)
    n, q = v[0], v[1]
    a = v[2 : 2 + n]
    rest = v[2 + n :]
    return "\n".join(str(sum(a[rest[2 * i] - 1 : rest[2 * i + 1]])) for i in range(q))


def _brackets_input(rng: random.Random) -> str:
    def balanced(depth: int) -> str:
        out = ""
        while rng.random() < 0.6 and len(out) < 12:
            o, c = rng.choice(("()", "[]", "{}"))
            out += o + (balanced(depth + 1) if depth < 3 else "") + c
        return out

    q = rng.randint(1, 6)
    lines = [str(q)]
    for _ in range(q):
        s = balanced(0) or "()"
        if rng.random() < 0.4:
            chars = list(s)
            rng.shuffle(chars)
            s = "".join(chars)
        lines.append(s)
    return "\n".join(lines) + "\n"


def _brackets(text: str) -> str:
    out = []
    for s in text.split("\n")[1 : 1 + int(text.split("\n")[0])]:
        stack: list[str] = []
        ok = True
        for ch in s:
            if ch in "([{":
                stack.append(ch)
            elif not stack or "([{"[")]}".index(ch)] != stack.pop():
                ok = False
                break
        out.append("YES" if ok and not stack else "NO")
    return "\n".join(out)


def _factorial(text: str) -> str:
    r = 1
    for i in range(1, int(text) + 1):
        r = r * i % 1_000_000_007
    return str(r)


_READ_LIST = "n = int(input())\na = list(map(int, input().split()))\n"
_SIEVE = """n = int(input())
sieve = bytearray([1]) * (n + 1)
sieve[0] = sieve[1] = 0
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytearray(len(range(i * i, n + 1, i)))
"""
_GCD = """import sys
data = sys.stdin.read().split()
q = int(data[0])
out = []
for i in range(q):
    a, b = int(data[1 + 2 * i]), int(data[2 + 2 * i])
    while b{cond}:
        a, b = b, a % b
    out.append(str(a))
print("\\n".join(out))
"""
_PALINDROME = """q = int(input())
for _ in range(q):
    s = input().strip(){lower}
    print("YES" if s == s[::-1] else "NO")
"""
_LEQ = """from bisect import {fn}
n, q = map(int, input().split())
a = sorted(map(int, input().split()))
for _ in range(q):
    print({fn}(a, int(input())))
"""
_RANGES = """n, q = map(int, input().split())
a = list(map(int, input().split()))
p = [0]
for x in a:
    p.append(p[-1] + x)
for _ in range(q):
    l, r = map(int, input().split())
    print(p[{r}] - p[l - 1])
"""
_BRACKETS_OK = """q = int(input())
for _ in range(q):
    s = input().strip()
    stack = []
    ok = True
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif not stack or "([{"[")]}".index(ch)] != stack.pop():
            ok = False
            break
    print("YES" if ok and not stack else "NO")
"""
_BRACKETS_WRONG = """q = int(input())
for _ in range(q):
    s = input().strip()
    opened = sum(s.count(c) for c in "([{")
    print("YES" if 2 * opened == len(s) else "NO")
"""
_FACTORIAL = """n = int(input())
r = 1
for i in range(1, n{plus}):
    r = r * i % 1000000007
print(r)
"""

FAMILIES = (
    Family(
        "sum_list",
        _sum_input,
        lambda t: str(sum(_ints(t)[1:])),
        _READ_LIST + "print(sum(a))\n",
        _READ_LIST + "total = 0\nfor i in range(1, n):\n    total += a[i]\nprint(total)\n",
    ),
    Family(
        "max_subarray",
        _maxsub_input,
        _maxsub,
        _READ_LIST + "best = cur = a[0]\nfor x in a[1:]:\n    cur = max(x, cur + x)\n"
        "    best = max(best, cur)\nprint(best)\n",
        _READ_LIST + "best = cur = 0\nfor x in a:\n    cur = max(0, cur + x)\n"
        "    best = max(best, cur)\nprint(best)\n",
    ),
    Family(
        "count_primes_below",
        _primes_input,
        lambda t: str(sum(1 for p in PRIMES if p < int(t))),
        _SIEVE + "print(sum(sieve[:n]))\n",
        _SIEVE + "print(sum(sieve[: n + 1]))\n",
    ),
    Family(
        "reverse_words",
        _words_input,
        lambda t: " ".join(t.split()[::-1]),
        'print(" ".join(input().split()[::-1]))\n',
        'w = input().split()\nprint(" ".join(w[-1:0:-1]))\n',
    ),
    Family(
        "fibonacci_mod",
        _fib_input,
        _fib,
        "n, m = map(int, input().split())\na, b = 0, 1\nfor _ in range(n):\n"
        "    a, b = b, (a + b) % m\nprint(a % m)\n",
        "n, m = map(int, input().split())\na, b = 0, 1\nfor _ in range(n - 1):\n"
        "    a, b = b, (a + b) % m\nprint(a % m)\n",
    ),
    Family(
        "sort_numbers",
        _sort_input,
        lambda t: " ".join(map(str, sorted(_ints(t)[1:]))),
        _READ_LIST + 'print(" ".join(map(str, sorted(a))))\n',
        'input()\nprint(" ".join(sorted(input().split())))\n',
    ),
    Family("gcd_pairs", _gcd_input, _gcd, _GCD.format(cond=""), _GCD.format(cond=" > 1")),
    Family(
        "palindromes",
        _palindrome_input,
        _palindrome,
        _PALINDROME.format(lower=".lower()"),
        _PALINDROME.format(lower=""),
    ),
    Family(
        "most_frequent_word",
        _frequent_input,
        _frequent,
        "from collections import Counter\nc = Counter(input().split())\n"
        "best = max(c.values())\nprint(min(w for w, k in c.items() if k == best))\n",
        "from collections import Counter\nprint(Counter(input().split()).most_common(1)[0][0])\n",
    ),
    Family(
        "pairs_with_sum",
        _pairs_input,
        _pairs,
        "n, k = map(int, input().split())\na = list(map(int, input().split()))\n"
        "print(sum(1 for i in range(n) for j in range(i + 1, n) if a[i] + a[j] == k))\n",
        "n, k = map(int, input().split())\na = list(map(int, input().split()))\n"
        "print(sum(1 for i in range(n) for j in range(i, n) if a[i] + a[j] == k))\n",
    ),
    Family(
        "count_at_most",
        _leq_input,
        _leq,
        _LEQ.format(fn="bisect_right"),
        _LEQ.format(fn="bisect_left"),
    ),
    Family("range_sums", _ranges_input, _ranges, _RANGES.format(r="r"), _RANGES.format(r="r - 1")),
    Family("balanced_brackets", _brackets_input, _brackets, _BRACKETS_OK, _BRACKETS_WRONG),
    Family(
        "factorial_mod",
        lambda rng: f"{rng.randint(0, 2000)}\n",
        _factorial,
        _FACTORIAL.format(plus=" + 1"),
        _FACTORIAL.format(plus=""),
    ),
)


@dataclass(frozen=True)
class Problem:
    index: int
    family: str
    #: What the response was made to be: correct, wrong, error, loop.
    kind: str
    code: str
    tests: list[dict[str, str]]


def _guard(rng: random.Random, inputs: list[str], hits: tuple[int, int], body: str) -> str:
    """``body`` run (before the solution) on the inputs of a chosen few tests: between
    ``hits`` of them, picked by the input's length as a buggy edge case would be."""
    lengths = [len(i) for i in inputs]
    for m in rng.sample(range(2, 60), 58):
        r = lengths[rng.randrange(len(lengths))] % m
        if hits[0] <= sum(1 for n in lengths if n % m == r) <= hits[1]:
            cond = f"len(_data) % {m} == {r}"
            break
    else:
        cond = f"_data == {rng.choice(inputs)!r}"
    return (
        "import io\nimport sys\n_data = sys.stdin.read()\nsys.stdin = io.StringIO(_data)\n"
        f"if {cond}:\n{body}\n"
    )


def make_problems(n: int, seed: int, shares: dict[str, float]) -> list[Problem]:
    """``n`` problems, each with 5-20 tests and one response of the kinds in ``shares``
    (exact counts, shuffled)."""
    rng = random.Random(seed)
    kinds: list[str] = []
    for kind in ("wrong", "error", "loop"):
        kinds += [kind] * round(n * shares[kind])
    kinds = (["correct"] * (n - len(kinds)) + kinds)[:n]
    rng.shuffle(kinds)
    problems = []
    for i, kind in enumerate(kinds):
        fam = FAMILIES[rng.randrange(len(FAMILIES))]
        inputs = [fam.make_input(rng) for _ in range(rng.randint(5, 20))]
        tests = [{"input": t, "output": fam.answer(t) + "\n"} for t in inputs]
        if kind == "wrong":
            code = fam.wrong
        elif kind == "error":
            crash = '    raise IndexError("list index out of range")'
            code = _guard(rng, inputs, (1, len(inputs)), crash) + fam.correct
        elif kind == "loop":
            code = _guard(rng, inputs, (1, 1), "    while True:\n        pass") + fam.correct
        else:
            code = fam.correct
        problems.append(Problem(i, fam.name, kind, code, tests))
    return problems


# --- the two arms -----------------------------------------------------------------------


@dataclass
class ArmRun:
    arm: str
    level: int
    round: int
    wall_s: float
    #: Per submission, per test: outcome, and whether it came near a limit.
    outcomes: list[list[str]]
    near: list[list[bool]]
    failures: int


async def anchor_test(
    python: str, code: str, test: dict[str, str], limits: SandboxLimits, nice: int, cwd: str
) -> tuple[str, bool]:
    """One test as a trainer runs it: a plain subprocess, killed at the wall limit."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        python,
        "-s",
        "-B",
        "-c",
        code,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=TEST_ENV,
        cwd=cwd,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    timed_out = False
    out = err = b""
    try:
        out, err = await asyncio.wait_for(proc.communicate(test["input"].encode()), limits.wall_s)
    except TimeoutError:
        timed_out = True
        proc.kill()
        await proc.wait()
    wall = time.monotonic() - started
    outcome = classify(
        timed_out=timed_out,
        returncode=proc.returncode if proc.returncode is not None else -9,
        stdout=out.decode("utf-8", "replace"),
        stderr_tail=err[-4096:].decode("utf-8", "replace"),
        output_over=False,
        expected=test["output"],
        compare="lines",
    )
    return outcome, outcome == "timeout" or wall > limits.near_limit * limits.wall_s


async def run_anchor(
    problems: list[Problem], level: int, rnd: int, python: str, limits: SandboxLimits, nice: int
) -> ArmRun:
    gate = asyncio.Semaphore(level)

    async def one(p: Problem) -> tuple[list[str], list[bool]]:
        async with gate:
            res = [await anchor_test(python, p.code, t, limits, nice, cwd) for t in p.tests]
        return [o for o, _ in res], [n for _, n in res]

    with tempfile.TemporaryDirectory(prefix="code-tests-anchor-") as cwd:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in problems))
        wall = time.perf_counter() - t0
    return ArmRun("anchor", level, rnd, wall, [r[0] for r in results], [r[1] for r in results], 0)


def submission_timeout(n_tests: int, limits: SandboxLimits) -> float:
    """Generous: a submission's sandbox is never the one cut (each test ends at its own
    wall limit; the slack covers process starts on a loaded host)."""
    return n_tests * (2 * limits.wall_s + 2) + 120


async def run_sandbox(
    problems: list[Problem], level: int, rnd: int, sandboxes: CodeSandboxes, spec: CodeTestsRule
) -> ArmRun:
    gate = asyncio.Semaphore(level)
    rule = f"bench/c{level}"
    failures = 0

    async def one(p: Problem) -> tuple[list[str], list[bool]]:
        nonlocal failures
        timeout = submission_timeout(len(p.tests), spec.limits)
        call = CodeCall(rule, submission(spec, p.code, p.tests), timeout, False)
        async with gate:
            try:
                verdicts = await sandboxes.run(call, timeout)
            except RuleCheckFailed as exc:
                failures += 1
                return [f"sandbox_{exc.reason}"] * len(p.tests), [False] * len(p.tests)
        return [v["outcome"] for v in verdicts], [bool(v["near_limit"]) for v in verdicts]

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in problems))
    wall = time.perf_counter() - t0
    return ArmRun(
        "sandbox", level, rnd, wall, [r[0] for r in results], [r[1] for r in results], failures
    )


def compare(problems: list[Problem], a: ArmRun, s: ArmRun) -> tuple[int, int, list[dict]]:
    """(tests compared, tests left out as timing-dependent, disagreements)."""
    compared = exempt = 0
    differ: list[dict] = []
    for p, ao, an, so, sn in zip(problems, a.outcomes, a.near, s.outcomes, s.near):
        for j, (x, y) in enumerate(zip(ao, so)):
            if x in TIMING or y in TIMING or an[j] or sn[j]:
                exempt += 1
                continue
            compared += 1
            if x != y:
                differ.append(
                    {
                        "round": a.round,
                        "problem": p.index,
                        "family": p.family,
                        "kind": p.kind,
                        "test": j,
                        "anchor": x,
                        "sandbox": y,
                    }
                )
        if len(ao) != len(so):
            differ.append({"round": a.round, "problem": p.index, "lengths": [len(ao), len(so)]})
    return compared, exempt, differ


# --- the fixed cost ---------------------------------------------------------------------


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {
        "runs": len(samples),
        "median_ms": round(1000 * statistics.median(samples), 2),
        "p90_ms": round(1000 * p90, 2),
        "min_ms": round(1000 * ordered[0], 2),
        "mean_ms": round(1000 * statistics.fmean(samples), 2),
    }


async def overhead(
    sandboxes: CodeSandboxes,
    spec: CodeTestsRule,
    python: str,
    runs: int,
    n_tests: int,
    nice: int,
) -> dict[str, Any]:
    """A ``print(1)`` submission of ``n_tests`` tests through the sandbox (level-1 rule)
    against the same tests as plain subprocesses, one at a time, arms alternating."""
    tests = [{"input": "", "output": "1\n"}] * n_tests
    sub = submission(spec, "print(1)\n", tests)
    timeout = submission_timeout(n_tests, spec.limits)
    rule = next(iter(sandboxes.rules))
    times: dict[str, list[float]] = {"sandbox": [], "anchor": []}
    #: Tests of print(1) that did not pass (a loaded host's timeout): should be 0.
    not_passed = {"sandbox": 0, "anchor": 0}
    with tempfile.TemporaryDirectory(prefix="code-tests-anchor-") as cwd:

        async def sandbox() -> None:
            verdicts = await sandboxes.run(CodeCall(rule, sub, timeout, False), timeout)
            not_passed["sandbox"] += sum(v["outcome"] != "passed" for v in verdicts)

        async def anchor() -> None:
            for t in tests:
                outcome, _ = await anchor_test(python, "print(1)\n", t, spec.limits, nice, cwd)
                not_passed["anchor"] += outcome != "passed"

        arms = {"sandbox": sandbox, "anchor": anchor}
        for name in arms:  # warm: page cache, the interpreter's files
            await arms[name]()
        for i in range(runs):
            for name in ("anchor", "sandbox") if i % 2 == 0 else ("sandbox", "anchor"):
                t0 = time.perf_counter()
                await arms[name]()
                times[name].append(time.perf_counter() - t0)
    out: dict[str, Any] = {"tests": n_tests, **{k: _ms(v) for k, v in times.items()}}
    out["sandbox_minus_anchor_median_ms"] = round(
        out["sandbox"]["median_ms"] - out["anchor"]["median_ms"], 2
    )
    out["tests_not_passed"] = not_passed
    out["samples_ms"] = {k: [round(1000 * x, 2) for x in v] for k, v in times.items()}
    return out


# --- the run ----------------------------------------------------------------------------


def tally(run_list: list[ArmRun]) -> dict[str, int]:
    c: Counter[str] = Counter()
    for r in run_list:
        for outcomes in r.outcomes:
            c.update(outcomes)
    return dict(sorted(c.items(), key=lambda kv: -kv[1]))


def arm_summary(run_list: list[ArmRun], problems: list[Problem]) -> dict[str, Any]:
    wall = sum(r.wall_s for r in run_list)
    subs = len(problems) * len(run_list)
    tests = sum(len(p.tests) for p in problems) * len(run_list)
    return {
        "wall_s": round(wall, 3),
        "submissions_per_s": round(subs / wall, 3),
        "tests_per_s": round(tests / wall, 2),
        "rounds_wall_s": [round(r.wall_s, 3) for r in run_list],
        "outcomes": tally(run_list),
        "near_limit_tests": sum(sum(n) for r in run_list for n in r.near),
        "sandbox_failures": sum(r.failures for r in run_list),
    }


async def bench(args: argparse.Namespace, problems: list[Problem]) -> dict[str, Any]:
    limits = SandboxLimits(cpu_s=args.cpu_s, wall_s=args.wall_s)
    specs = {
        f"bench/c{level}": CodeTestsRule(concurrency=level, limits=limits, deterministic=False)
        for level in args.concurrency
    }
    sandboxes = CodeSandboxes(specs)
    await sandboxes.probe()
    identity = sandboxes.identity(next(iter(specs)))
    python = LocalBackend(LocalSandbox()).python
    spec = next(iter(specs.values()))
    print(f"sandbox: {identity}; anchor: {python} -s -B -c CODE", flush=True)

    runs: dict[int, dict[str, list[ArmRun]]] = {
        c: {"anchor": [], "sandbox": []} for c in args.concurrency
    }
    for rnd in range(args.rounds):
        for li, level in enumerate(args.concurrency):
            order = ("anchor", "sandbox") if (rnd + li) % 2 == 0 else ("sandbox", "anchor")
            for arm in order:
                if arm == "anchor":
                    r = await run_anchor(problems, level, rnd, python, limits, args.anchor_nice)
                else:
                    r = await run_sandbox(problems, level, rnd, sandboxes, specs[f"bench/c{level}"])
                runs[level][arm].append(r)
                print(
                    f"round {rnd} c={level:<3} {arm:<7} {r.wall_s:8.2f} s "
                    f"{len(problems) / r.wall_s:8.2f} submissions/s",
                    flush=True,
                )

    levels: dict[str, Any] = {}
    for level, arms in runs.items():
        row: dict[str, Any] = {k: arm_summary(v, problems) for k, v in arms.items()}
        row["sandbox_over_anchor"] = round(
            row["sandbox"]["submissions_per_s"] / row["anchor"]["submissions_per_s"], 3
        )
        row["per_round_sandbox_over_anchor"] = [
            round(a.wall_s / s.wall_s, 3) for a, s in zip(arms["anchor"], arms["sandbox"])
        ]
        compared = exempt = 0
        differ: list[dict] = []
        for a, s in zip(arms["anchor"], arms["sandbox"]):
            c, e, d = compare(problems, a, s)
            compared, exempt, differ = compared + c, exempt + e, differ + d
        row["tests_compared"] = compared
        row["tests_timing_exempt"] = exempt
        row["disagreements"] = differ
        by_kind: dict[str, Counter[str]] = {}
        for r in arms["sandbox"]:
            for p, outcomes in zip(problems, r.outcomes):
                by_kind.setdefault(p.kind, Counter()).update(outcomes)
        row["sandbox_outcomes_by_kind"] = {k: dict(v) for k, v in sorted(by_kind.items())}
        levels[str(level)] = row

    print(
        f"fixed cost: {args.overhead_runs} sequential runs each, 1 test"
        + (f" and {args.overhead_tests} tests" if args.overhead_tests > 1 else ""),
        flush=True,
    )
    fixed = {
        "one_test": await overhead(sandboxes, spec, python, args.overhead_runs, 1, args.anchor_nice)
    }
    if args.overhead_tests > 1:
        many = await overhead(
            sandboxes, spec, python, args.overhead_runs, args.overhead_tests, args.anchor_nice
        )
        fixed["many_tests"] = many
        extra = args.overhead_tests - 1
        fixed["sandbox_ms_per_extra_test"] = round(
            (many["sandbox"]["median_ms"] - fixed["one_test"]["sandbox"]["median_ms"]) / extra, 2
        )
        fixed["anchor_ms_per_extra_test"] = round(
            (many["anchor"]["median_ms"] - fixed["one_test"]["anchor"]["median_ms"]) / extra, 2
        )
    await sandboxes.close()
    return {
        "sandbox_identity": identity,
        "interpreter": python,
        "limits": limits.model_dump(),
        "levels": levels,
        "overhead": fixed,
    }


def print_summary(result: dict[str, Any]) -> None:
    head = (
        f"{'c':>4} {'arm':<8} {'wall s':>9} {'subs/s':>8} {'tests/s':>9} "
        f"{'sbx/anchor':>10}  outcomes"
    )
    print()
    print(head)
    print("-" * len(head))
    for level, row in result["levels"].items():
        for arm in ("anchor", "sandbox"):
            r = row[arm]
            ratio = f"{row['sandbox_over_anchor']:.3f}" if arm == "sandbox" else ""
            outcomes = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items())
            print(
                f"{level:>4} {arm:<8} {r['wall_s']:9.2f} {r['submissions_per_s']:8.2f} "
                f"{r['tests_per_s']:9.1f} {ratio:>10}  {outcomes}"
            )
        print(
            f"{'':>4} agreement: {row['tests_compared'] - len(row['disagreements'])} / "
            f"{row['tests_compared']} tests the same, {row['tests_timing_exempt']} left out "
            f"(timeout or near a limit in either arm); sandbox by kind: "
            + "; ".join(
                f"{k}: " + ", ".join(f"{o} {n}" for o, n in v.items())
                for k, v in row["sandbox_outcomes_by_kind"].items()
            )
        )
    print()
    fixed = result["overhead"]
    for key in ("one_test", "many_tests"):
        if key not in fixed:
            continue
        f = fixed[key]
        print(
            f"fixed cost, {f['tests']} x print(1): sandbox median {f['sandbox']['median_ms']:.1f} "
            f"ms (p90 {f['sandbox']['p90_ms']:.1f}), plain subprocess median "
            f"{f['anchor']['median_ms']:.1f} ms (p90 {f['anchor']['p90_ms']:.1f}): "
            f"+{f['sandbox_minus_anchor_median_ms']:.1f} ms per sandbox run"
        )
    if "sandbox_ms_per_extra_test" in fixed:
        print(
            f"per extra test: sandbox {fixed['sandbox_ms_per_extra_test']:.1f} ms, plain "
            f"subprocess {fixed['anchor_ms_per_extra_test']:.1f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 16, 64],
        help="Comma-separated levels (default 1,16,64).",
    )
    ap.add_argument("--rounds", type=int, default=2, help="Each level this many times per arm.")
    ap.add_argument("--cpu-s", type=float, default=1.0, help="Per-test CPU limit (sandbox).")
    ap.add_argument("--wall-s", type=float, default=2.0, help="Per-test wall limit (both).")
    ap.add_argument("--wrong-share", type=float, default=0.20)
    ap.add_argument("--error-share", type=float, default=0.05)
    ap.add_argument("--loop-share", type=float, default=0.05)
    ap.add_argument(
        "--anchor-nice", type=int, default=0, help="Nice the anchor's tests (the sandbox: 10)."
    )
    ap.add_argument("--overhead-runs", type=int, default=30)
    ap.add_argument(
        "--overhead-tests", type=int, default=10, help="Also a K-test print(1) (0: not)."
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "reports" / f"code_tests-{datetime.date.today()}.json",
    )
    args = ap.parse_args()
    shares = {"wrong": args.wrong_share, "error": args.error_share, "loop": args.loop_share}
    problems = make_problems(args.problems, args.seed, shares)
    n_tests = [len(p.tests) for p in problems]
    workload = {
        "problems": len(problems),
        "tests": sum(n_tests),
        "tests_per_problem": {
            "min": min(n_tests),
            "mean": round(statistics.fmean(n_tests), 2),
            "max": max(n_tests),
        },
        "kinds": dict(Counter(p.kind for p in problems)),
        "families": dict(Counter(p.family for p in problems)),
    }
    print(f"workload: {json.dumps(workload)}", flush=True)
    load_start = os.getloadavg()
    started = time.monotonic()
    measured = asyncio.run(bench(args, problems))
    command = (
        ".venv/bin/python benchmarks/code_tests.py "
        f"--problems {args.problems} --concurrency {','.join(map(str, args.concurrency))} "
        f"--rounds {args.rounds} --cpu-s {args.cpu_s:g} --wall-s {args.wall_s:g} "
        f"--wrong-share {args.wrong_share:g} --error-share {args.error_share:g} "
        f"--loop-share {args.loop_share:g} --anchor-nice {args.anchor_nice} "
        f"--overhead-runs {args.overhead_runs} --overhead-tests {args.overhead_tests} "
        f"--seed {args.seed}"
    )
    result = {
        "command": command,
        "argv": shlex.join(sys.argv),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": {
            "cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "python": {"benchmark": sys.version, "executable": sys.executable},
        "total_wall_s": round(time.monotonic() - started, 1),
        "workload": workload,
        **measured,
    }
    print_summary(result)
    disagreements = [
        (level, d) for level, row in result["levels"].items() for d in row["disagreements"]
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    if disagreements:
        print(f"\n{len(disagreements)} tests whose outcome differs between the arms:")
        for level, d in disagreements[:50]:
            print(f"  c={level}: {json.dumps(d)}")
        sys.exit(1)
    print("every compared test's outcome is the same in both arms")


if __name__ == "__main__":
    main()
