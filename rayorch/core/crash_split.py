"""What a physical failure does to each Grain of the failed attempt (pure).

A *crash* (the actor died under the attempt: a segfault in native code, ``os._exit``, an
OOM kill; Ray's ``ActorDiedError``) does not say which record killed the actor, nor
whether this batch was the one running: a batch queued behind a poison one dies with it.
So a crash retry is narrowed down instead of blamed:

* the retry goes to an actor with nothing else on it (``alone``), so its next death is
  its own;
* a batch that died **alone** is split into halves (``limit``), recursively, until the
  poison record is alone; a crash shared with other batches splits as well;
* only a record that dies alone, in a batch of one, is *charged* an attempt: after
  ``max_attempts`` such deaths it fails alone, with the crash's cause. Its batch-mates
  and bystanders are never charged for a neighbour's crash.

The uncharged retries of one Grain are bounded by :func:`uncharged_budget` (one shared
death, then one per halving), so a record is attempted at most
``uncharged_budget(batch_size) + max_attempts`` times. Past that budget a crash is
charged whatever its batch (a safety net: it is reached only when isolation could not be
had, e.g. an actor shared with another driver).

Any other physical failure (``ro.ActorFailure``, a timeout, a lost batch, a driver
failover) keeps the plain rule: charged, retried one Grain per batch on any actor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """For one Grain: fail now, or retry with this batch ``limit`` (and the fact's flags)."""

    fail: bool
    limit: int = 1
    charged: bool = True
    alone: bool = False


def uncharged_budget(batch_size: int) -> int:
    """Crash retries a Grain may take without being charged: 1 + ceil(log2(batch_size))."""
    return 1 + max(0, batch_size - 1).bit_length()


def retry_decision(
    *,
    crashed: bool,
    alone: bool,
    size: int,
    uncharged: int,
    charged: int,
    max_attempts: int,
    batch_size: int,
) -> RetryDecision:
    """The decision for one Grain of a failed attempt.

    ``crashed``: the actor died under the attempt; ``alone``: the attempt had its actor to
    itself; ``size``: the Grains of the attempt that failed with this one; ``uncharged`` /
    ``charged``: the Grain's earlier failures of each kind.
    """
    if not crashed:
        return RetryDecision(fail=charged + 1 >= max_attempts)
    blame = alone and size == 1
    if not blame and uncharged < uncharged_budget(batch_size):
        return RetryDecision(fail=False, limit=max(1, (size + 1) // 2), charged=False, alone=True)
    return RetryDecision(fail=charged + 1 >= max_attempts, alone=True)


__all__ = ["RetryDecision", "retry_decision", "uncharged_budget"]
