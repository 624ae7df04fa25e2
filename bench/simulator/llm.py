"""A continuous-batching inference engine in virtual time, for the simulator's model stages.

Each actor of a model stage holds one engine. The engine decodes in steps: a step costs
``step_a_s + step_b_s * n`` for ``n`` running requests and gives each of them one token; a
request leaves when it has its output length (``tokens(row)``, long-tailed for pages); at
most ``max_seqs`` run at once, the rest wait inside the engine (vLLM's scheduler queue).

An actor holds up to ``depth`` batches and runs ``inflight`` of them at once: with
``inflight=1`` a batch is one synchronous ``generate`` (its requests enter together and the
batch ends with its longest one); with ``inflight=N`` the requests of N batches share the
engine (an async engine, rayorch's ``max_inflight=N``). A batch reaches its actor
``latency_s`` after the driver sends it and its result reaches the driver ``latency_s``
after it ends (Ray's task round trip, the commit).

The engine is *busy* while at least one request is inside it (running or waiting); the
busy fraction of a stage is its busy time over each actor's window after start-up (from
its first batch's arrival to its last batch's end), summed over the actors.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_EPS = 1e-9


@dataclass(frozen=True)
class EngineModel:
    """The engine's speed and the actor's concurrency, in virtual seconds."""

    tokens: Callable[[tuple[Any, ...]], int]
    step_a_s: float = 0.020
    step_b_s: float = 0.00025
    max_seqs: int = 64
    latency_s: float = 0.010
    inflight: int = 1
    depth: int = 2

    def step_s(self, running: int) -> float:
        return self.step_a_s + self.step_b_s * running


@dataclass
class _Batch:
    key: int
    lengths: list[int]  # output tokens of each request
    arrived_s: float
    left: int = 0  # requests not finished


@dataclass
class _Actor:
    queued: deque[_Batch] = field(default_factory=deque)  # arrived, not started
    started: int = 0  # batches started and not ended
    waiting: deque[tuple[float, _Batch]] = field(default_factory=deque)  # (tokens, batch)
    running: list[list[Any]] = field(default_factory=list)  # [tokens left, batch]
    last_s: float = 0.0
    busy_s: float = 0.0
    seq_s: float = 0.0  # integral of running requests over time
    tokens: float = 0.0
    first_s: float | None = None
    end_s: float = 0.0


class EnginePool:
    """The engines of one model stage's actors; the simulator drives it event by event."""

    def __init__(self, model: EngineModel, actors: int) -> None:
        self.model = model
        self.actors = [_Actor() for _ in range(actors)]
        self._arrivals: list[tuple[float, int, int, _Batch]] = []
        self._seq = itertools.count()

    def send(self, actor: int, key: int, rows: list[tuple[Any, ...]], now: float) -> None:
        """The driver sends a batch to ``actor`` at ``now``; it arrives ``latency_s`` later."""
        lengths = [max(1, int(self.model.tokens(row))) for row in rows]
        batch = _Batch(key, lengths, now + self.model.latency_s, len(lengths))
        heapq.heappush(self._arrivals, (batch.arrived_s, next(self._seq), actor, batch))

    def next_s(self) -> float:
        """The virtual time of the next arrival or request completion (inf: nothing)."""
        best = self._arrivals[0][0] if self._arrivals else math.inf
        for actor in self.actors:
            if actor.running:
                left = min(r[0] for r in actor.running)
                best = min(best, actor.last_s + left * self.model.step_s(len(actor.running)))
        return best

    def advance(self, now: float) -> list[tuple[int, float]]:
        """Run every engine up to ``now`` (at most the next event); the batches that ended,
        with the time their result reaches the driver."""
        done: list[tuple[int, float]] = []
        for actor in self.actors:
            self._run(actor, now, done)
        while self._arrivals and self._arrivals[0][0] <= now + _EPS:
            _, _, index, batch = heapq.heappop(self._arrivals)
            actor = self.actors[index]
            if actor.first_s is None:
                actor.first_s = now
            actor.queued.append(batch)
            self._start(actor)
        return done

    def _start(self, actor: _Actor) -> None:
        while actor.queued and actor.started < self.model.inflight:
            batch = actor.queued.popleft()
            actor.started += 1
            actor.waiting.extend((float(length), batch) for length in batch.lengths)
        while actor.waiting and len(actor.running) < self.model.max_seqs:
            tokens, batch = actor.waiting.popleft()
            actor.running.append([tokens, batch])

    def _run(self, actor: _Actor, now: float, done: list[tuple[int, float]]) -> None:
        span = now - actor.last_s
        if span > 0 and actor.running:
            n = len(actor.running)
            steps = span / self.model.step_s(n)
            actor.busy_s += span
            actor.seq_s += n * span
            actor.tokens += steps * n
            for request in actor.running:
                request[0] -= steps
        elif span > 0 and actor.waiting:
            actor.busy_s += span
        actor.last_s = max(actor.last_s, now)
        finished = [r for r in actor.running if r[0] <= _EPS]
        if not finished:
            return
        actor.running = [r for r in actor.running if r[0] > _EPS]
        for _, batch in finished:
            batch.left -= 1
            if batch.left == 0:
                actor.started -= 1
                actor.end_s = now
                done.append((batch.key, now + self.model.latency_s))
        self._start(actor)

    # -- figures ------------------------------------------------------------------------
    def busy_fraction(self) -> float:
        """Time with a request inside the engine / each actor's window after start-up."""
        window = sum(a.end_s - a.first_s for a in self.actors if a.first_s is not None)
        return sum(a.busy_s for a in self.actors) / window if window else 0.0

    def occupancy(self) -> float:
        """Mean running requests over ``max_seqs`` while the engines were busy."""
        busy = sum(a.busy_s for a in self.actors)
        return sum(a.seq_s for a in self.actors) / busy / self.model.max_seqs if busy else 0.0

    def tokens_per_s(self) -> float:
        """Tokens decoded per second of each engine's window, summed over the engines."""
        window = sum(a.end_s - a.first_s for a in self.actors if a.first_s is not None)
        return sum(a.tokens for a in self.actors) / window * len(self.actors) if window else 0.0


__all__ = ["EngineModel", "EnginePool"]
