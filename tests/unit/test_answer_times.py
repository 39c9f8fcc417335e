"""A slot's round-trip estimate (peak EWMA), with an injected clock."""

from __future__ import annotations

from gateway.transport.answer_times import AnswerTimes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_mean_of_answered_round_trips_and_the_age_of_a_stalled_request():
    clock = Clock()
    times = AnswerTimes(clock, alpha=0.5)
    assert times.seconds() == 0.0
    t = times.started()
    clock.now = 1.0
    times.finished(t, answered=True)
    assert times.seconds() == 1.0
    t = times.started()
    clock.now = 4.0
    times.finished(t, answered=True)
    assert times.seconds() == 2.0  # 1 + 0.5 * (3 - 1)
    stalled = times.started()
    clock.now = 14.0  # nothing answered for 10 s: the estimate follows the oldest request
    assert times.seconds() == 10.0
    times.finished(stalled, answered=False)  # a failure is not an answer time
    assert times.seconds() == 2.0


def test_a_serialized_engines_round_trip_is_shared_by_the_requests_in_it():
    """Four in a serialized engine: the last one's round trip is four service times."""
    clock = Clock()
    times = AnswerTimes(clock, alpha=1.0)
    t = times.started(share=4)
    clock.now = 2.0
    assert times.seconds() == 0.5  # the oldest in flight, per answer
    times.finished(t, answered=True)
    assert times.seconds() == 0.5


def test_the_mean_is_shown_on_the_slots_gauge():
    class Gauge:
        value = None

        def set(self, value: float) -> None:
            self.value = value

    clock, gauge = Clock(), Gauge()
    times = AnswerTimes(clock, alpha=1.0, gauge=gauge)
    t = times.started(share=2)
    clock.now = 3.0
    times.finished(t, answered=True)
    assert gauge.value == 1.5


def test_the_peak_age_is_the_one_over_every_request_in_flight():
    """``seconds`` looks at the oldest request of each share only: the same value as the
    maximum over every request in flight, on random starts, shares and finishes."""
    import random

    rng = random.Random(3)
    now = [0.0]
    times = AnswerTimes(lambda: now[0], alpha=0.5)
    live: dict[int, tuple[float, int]] = {}
    for _ in range(2000):
        now[0] += rng.random() * 0.01
        if live and rng.random() < 0.45:
            token = rng.choice(list(live))
            del live[token]
            times.finished(token, answered=rng.random() < 0.8)
        else:
            share = rng.choice([1, 1, 2, 3, 4, 8])
            live[times.started(share)] = (now[0], share)
        brute = max([(now[0] - s) / k for s, k in live.values()], default=0.0)
        assert times.seconds() == max(times.mean_s or 0.0, brute)
