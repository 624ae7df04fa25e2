"""The pure crash-split decision (core/crash_split.py): who is charged, how batches shrink."""

from __future__ import annotations

import pytest

from rayorch.core.crash_split import RetryDecision, retry_decision, uncharged_budget


def decide(*, crashed: bool = True, alone: bool = True, size: int = 1, uncharged: int = 0,
           charged: int = 0, max_attempts: int = 3, batch_size: int = 8) -> RetryDecision:
    return retry_decision(crashed=crashed, alone=alone, size=size, uncharged=uncharged,
                          charged=charged, max_attempts=max_attempts, batch_size=batch_size)


def test_a_crash_splits_the_batch_in_halves_on_an_actor_of_its_own_uncharged() -> None:
    assert decide(alone=False, size=5) == RetryDecision(False, 3, charged=False, alone=True)
    assert decide(alone=True, size=2) == RetryDecision(False, 1, charged=False, alone=True)
    assert decide(alone=False, size=1) == RetryDecision(False, 1, charged=False, alone=True)


def test_only_a_record_that_dies_alone_is_charged() -> None:
    assert decide(size=1, charged=0) == RetryDecision(False, 1, charged=True, alone=True)
    assert decide(size=1, charged=2).fail  # its third death alone: max_attempts=3


def test_other_physical_failures_keep_the_plain_rule() -> None:
    assert decide(crashed=False, size=4) == RetryDecision(False)
    assert decide(crashed=False, size=4, charged=2).fail


@pytest.mark.parametrize("batch_size", [1, 2, 3, 6, 8, 64])
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_poison_record_ends_within_its_bound(batch_size: int, max_attempts: int) -> None:
    """A record that kills every batch it is in: shared death, halvings, deaths alone."""
    size, alone, uncharged, charged, attempts = batch_size, False, 0, 0, 0
    while True:
        attempts += 1
        decision = decide(alone=alone, size=size, uncharged=uncharged, charged=charged,
                          max_attempts=max_attempts, batch_size=batch_size)
        if decision.fail:
            break
        uncharged += not decision.charged
        charged += decision.charged
        size, alone = decision.limit, decision.alone
    assert charged == max_attempts - 1
    assert attempts <= uncharged_budget(batch_size) + max_attempts
    assert uncharged_budget(batch_size) == 1 + (batch_size - 1).bit_length()


def test_past_its_uncharged_budget_a_crash_is_charged() -> None:
    """The safety net: an actor shared with other drivers is never quite alone."""
    assert decide(alone=False, size=4, uncharged=uncharged_budget(8), batch_size=8) == \
        RetryDecision(False, 1, charged=True, alone=True)
