"""The pool ledger's rules without Ray (rayorch/runtime/pool_ledger.py): fair budgets between
runs, one leader per run, shared pools' live sets, and when a dropped actor may be killed."""

from __future__ import annotations

from rayorch.core.pool_sizing import StageLoad
from rayorch.runtime.pool_ledger import CLAIM_TTL_S, PoolLedgerState

CLUSTER = {"CPU": 8.0}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ocr(backlog: int) -> StageLoad:
    return StageLoad(name="ocr", size=1, min_size=1, max_size=8, need={"CPU": 1.0},
                     backlog=backlog, item_cost_s=0.5)


def test_a_second_run_halves_the_first_runs_budget_and_a_gone_run_gives_it_back() -> None:
    clock = Clock()
    ledger = PoolLedgerState(clock=clock)
    first = ledger.report("run-a", "d1", capacity=CLUSTER, wants={"CPU": 8.0})
    assert first.budget == {"CPU": 8.0} and first.leader and first.runs == 1
    second = ledger.report("run-b", "d2", capacity=CLUSTER, wants={"CPU": 8.0})
    assert second.budget == {"CPU": 4.0} and second.runs == 2
    assert ledger.report("run-a", "d1", capacity=CLUSTER, wants={"CPU": 8.0}).budget == \
        {"CPU": 4.0}
    clock.now += CLAIM_TTL_S + 1  # run-b's driver stopped reporting
    assert ledger.report("run-a", "d1", capacity=CLUSTER, wants={"CPU": 8.0}).budget == \
        {"CPU": 8.0}
    ledger.leave("run-a", "d1")
    assert ledger.claims == {}


def test_the_drivers_of_one_run_share_one_budget_and_one_of_them_leads() -> None:
    ledger = PoolLedgerState(clock=Clock())
    a = ledger.report("run", "driver-a", capacity=CLUSTER, wants={"CPU": 6.0},
                      loads=[ocr(4)], held={"ocr": [0]})
    b = ledger.report("run", "driver-b", capacity=CLUSTER, wants={}, loads=[ocr(9)],
                      held={"ocr": [0]})
    other = ledger.report("other", "driver-c", capacity=CLUSTER, wants={"CPU": 8.0})
    assert other.budget == {"CPU": 4.0}  # two runs, not three drivers
    a = ledger.report("run", "driver-a", capacity=CLUSTER, wants={"CPU": 6.0},
                      loads=[ocr(4)], held={"ocr": [0]})
    b = ledger.report("run", "driver-b", capacity=CLUSTER, wants={}, loads=[ocr(9)],
                      held={"ocr": [0]})
    assert a.leader and not b.leader
    assert a.budget == b.budget == {"CPU": 4.0}
    assert [p.backlog for p in a.peers] == [9]  # the leader sees the other driver's work
    assert b.peers == ()


def test_the_leader_stays_while_it_reports_and_another_leads_once_it_is_gone() -> None:
    clock = Clock()
    ledger = PoolLedgerState(clock=clock)
    assert ledger.report("run", "z-first", capacity=CLUSTER, wants={}).leader
    assert not ledger.report("run", "a-later", capacity=CLUSTER, wants={}).leader
    assert ledger.report("run", "z-first", capacity=CLUSTER, wants={}).leader
    clock.now += CLAIM_TTL_S / 2
    ledger.report("run", "a-later", capacity=CLUSTER, wants={})
    clock.now += CLAIM_TTL_S / 2 + 1  # z-first stopped reporting
    assert ledger.report("run", "a-later", capacity=CLUSTER, wants={}).leader


def test_a_dropped_shared_actor_is_killed_only_once_every_driver_let_go_of_it() -> None:
    ledger = PoolLedgerState(clock=Clock())
    for driver in ("a", "b"):
        ledger.report("run", driver, capacity=CLUSTER, wants={}, held={"ocr": [0]})
    live, version = ledger.resize("run", "ocr", 3)
    assert live == (0, 1, 2) and version == 1
    for driver in ("a", "b"):  # both adopt the growth
        reply = ledger.report("run", driver, capacity=CLUSTER, wants={}, held={"ocr": [0, 1, 2]},
                              version=version)
        assert reply.live == {"ocr": (0, 1, 2)}
    live, version = ledger.resize("run", "ocr", 1, drop_first=[1])
    assert live == (0,) and version == 2
    # b has not adopted the drop yet: nothing may be killed
    reply = ledger.report("run", "a", capacity=CLUSTER, wants={}, held={"ocr": [0]},
                          version=2)
    assert reply.leader and reply.retire == {}
    # b adopted it but still has a batch on actor 2
    ledger.report("run", "b", capacity=CLUSTER, wants={}, held={"ocr": [0, 2]}, version=2)
    reply = ledger.report("run", "a", capacity=CLUSTER, wants={}, held={"ocr": [0]}, version=2)
    assert reply.retire == {"ocr": (1,)}
    ledger.retired("run", "ocr", [1])
    ledger.report("run", "b", capacity=CLUSTER, wants={}, held={"ocr": [0]}, version=2)
    reply = ledger.report("run", "a", capacity=CLUSTER, wants={}, held={"ocr": [0]}, version=2)
    assert reply.retire == {"ocr": (2,)}
    # indexes are never reused: a later growth gets fresh names
    assert ledger.resize("run", "ocr", 2)[0] == (0, 3)


def test_a_restarted_ledger_learns_the_live_sets_back_from_the_drivers() -> None:
    ledger = PoolLedgerState(clock=Clock())
    reply = ledger.report("run", "a", capacity=CLUSTER, wants={}, held={"ocr": [0, 4, 5]})
    assert reply.live == {"ocr": (0, 4, 5)}
    assert ledger.live("run") == {"ocr": (0, 4, 5)}
    assert ledger.resize("run", "ocr", 4)[0] == (0, 4, 5, 6)
    assert ledger.live("nobody") == {}


def test_runs_claim_cpus_gpus_and_custom_resources_not_rays_bookkeeping() -> None:
    from rayorch.runtime.pool_ledger import claimable

    assert claimable("CPU") and claimable("GPU") and claimable("cpu-node")
    for key in ("memory", "object_store_memory", "node:10.0.0.1", "node:__internal_head__",
                "CPU_group_0_7fd1e6fec6b8b0c63b42968bcffd02000000", "bundle_group_7fd1e6fe",
                "accelerator_type:H100"):
        assert not claimable(key), key
