"""The Ray runtime end to end: real Ray (one local instance per session), real redis-server.

Every pipeline here runs on actor pools; the memory store and the Redis store must
give the same results as the sequential reference interpreter.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.actors.pool import PoolError
from rayorch.core.commit import CommitVerdict
from rayorch.core.facts import GrainCommitted, GrainRetried
from rayorch.core.machine import item_result
from rayorch.core.outcome import FailedResult, Outcome
from rayorch.core.reference import evaluate
from rayorch.inspect.audit import audit_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Ray workers cannot import this test module by name: ship its classes by value.
ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

def log_call(log_dir: str | None, tag: str, values: list[Any]) -> None:
    """Append one line per record a UDF saw (files: many actor processes, one machine)."""
    if log_dir is None:
        return
    with open(Path(log_dir) / f"{tag}.log", "a") as f:
        for value in values:
            f.write(f"{value}\n")


def logged(log_dir: Path, tag: str) -> list[str]:
    path = log_dir / f"{tag}.log"
    return path.read_text().split() if path.exists() else []


# -- user modules (module level: Ray workers import them by name) ----------------------
class Sections:
    """doc -> sections: ``doc`` is ``(name, [n_lines per section])``."""

    def __call__(self, docs: list[Any]) -> list[Any]:
        return [[(doc[0], k, n) for k, n in enumerate(doc[1])] for doc in docs]


class Lines:
    def __call__(self, sections: list[Any]) -> list[Any]:
        return [[f"{s[0]}.{s[1]}.{i}" for i in range(s[2])] for s in sections]


class Upper:
    def __init__(self, log_dir: str | None = None) -> None:
        self.log_dir = log_dir

    def __call__(self, lines: list[str]) -> list[Any]:
        log_call(self.log_dir, "upper", lines)
        out: list[Any] = []
        for line in lines:
            if "!group" in line:
                out.append(ro.GroupFailure(f"bad line {line}"))
            elif "!record" in line:
                out.append(ro.RecordFailure(f"bad line {line}"))
            else:
                out.append(line.upper())
        return out


class Count:
    def __call__(self, groups: list[list[str]]) -> list[Any]:
        return [(len(g), "|".join(g)) for g in groups]


class Summary:
    def __call__(self, doc_parts: list[list[Any]]) -> list[Any]:
        # The joined text makes the result depend on ordinal order at both reduce levels.
        return [
            {"sections": len(parts), "lines": sum(p[0] for p in parts),
             "text": ";".join(p[1] for p in parts)}
            for parts in doc_parts
        ]


class Nested(ro.Pipeline):
    """doc -> sections -> lines -> upper, reduced twice (nested fan-out and fan-in)."""

    def __init__(self, batch_size: int = 4, replicas: int = 2, policy: str = "elastic") -> None:
        super().__init__()
        self.sections = ro.RayModule(Sections, num_cpus=0.1)
        self.lines = ro.RayModule(Lines, num_cpus=0.1, batch_size=3)
        self.upper = ro.RayModule(
            Upper, num_cpus=0.1, batch_size=batch_size, replicas=replicas, policy=policy
        )
        self.count = ro.RayModule(Count, num_cpus=0.1, batch_size=5)
        self.summary = ro.RayModule(Summary, num_cpus=0.1)

    def forward(self, docs: Any) -> Any:
        sections = F.expand(self.sections(docs))
        lines = F.expand(self.lines(sections))
        counted = self.count(F.reduce(self.upper(lines)))
        return self.summary(F.reduce(counted))


def nested_docs(n: int) -> list[Any]:
    return [(f"d{i}", [(i * 7 + k) % 5 for k in range(i % 4)]) for i in range(n)]


def assert_audit_ok(store_url: str, run_id: str) -> None:
    """The run's stored facts pass every invariant of ``rayorch audit``."""
    report = audit_run(open_store(store_url), run_id)
    assert report.ok, [str(v) for v in report.violations]


def comparable(value: Any) -> Any:
    """A result with the cause of a FailedResult left out (causes of Suppressed may differ)."""
    if isinstance(value, FailedResult):
        return ("not present", value.index, value.outcome, value.port)
    return value


def reference_results(pipeline: ro.Pipeline, inputs: list[Any]) -> list[Any]:
    """The sequential reference interpreter's answer, in the shape ``run`` yields."""
    plan = pipeline.compile()
    outputs = evaluate(plan, [(x,) for x in inputs]).outputs
    return [
        comparable(item_result(i, outputs[i], plan.output_names)) for i in range(len(inputs))
    ]


@pytest.mark.parametrize("policy", ["elastic", "parent_bound"])
def test_nested_fanout_matches_reference(store_url: str, policy: str) -> None:
    docs = nested_docs(24)
    pipeline = Nested(policy=policy)
    run = pipeline.run(
        docs, store=store_url, progress=False, micro_batch=4, shards=2, max_active_sources=8
    )
    got = list(run)
    assert [i for i, _ in got] == list(range(len(docs)))  # ordered=True: source order
    assert [comparable(v) for _, v in got] == reference_results(pipeline, docs)
    store = open_store(store_url)
    assert store.run_info(run.run_id).fingerprint == pipeline.compile().fingerprint()
    assert_audit_ok(store_url, run.run_id)


def test_unordered_results_and_failures_come_back(store_url: str) -> None:
    docs: list[Any] = nested_docs(6)
    docs[2] = ("x!record", [2, 1])  # every line a RecordFailure -> the doc is Suppressed
    docs.append(("y!group", [3, 0]))  # GroupFailure in the first section
    docs.append(("empty", []))
    pipeline = Nested()
    got = dict(pipeline.run(docs, store=store_url, progress=False, ordered=False))
    assert sorted(got) == list(range(len(docs)))
    expected = reference_results(pipeline, docs)
    assert [comparable(got[i]) for i in range(len(docs))] == expected
    assert isinstance(got[2], FailedResult) and isinstance(got[6], FailedResult)


class Pages:
    def __call__(self, docs: list[Any]) -> list[Any]:
        return [
            [f"{name}:{k}{'!group' if k in bad else ''}" for k in range(n)] for name, n, bad in docs
        ]


class PerPage:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def __call__(self, pages: list[str]) -> list[Any]:
        log_call(self.log_dir, "page", pages)
        time.sleep(0.05)
        return [
            ro.GroupFailure(f"page {p} is poisoned") if p.endswith("!group") else p for p in pages
        ]


class Gather:
    def __call__(self, lists: list[list[str]]) -> list[Any]:
        return [len(x) for x in lists]


class Poisoned(ro.Pipeline):
    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.pages = ro.RayModule(Pages, num_cpus=0.1)
        self.page = ro.RayModule(PerPage, log_dir=log_dir, num_cpus=0.1, replicas=1)
        self.gather = ro.RayModule(Gather, num_cpus=0.1)

    def forward(self, docs: Any) -> Any:
        return self.gather(F.reduce(self.page(F.expand(self.pages(docs)))))


def test_group_failure_suppresses_queued_siblings_before_dispatch(
    store_url: str, tmp_path: Path
) -> None:
    # One actor, batches of one: the poisoned page 0 of "big" runs first; its
    # 59 siblings are still queued when its GroupFailure commits.
    docs = [("big", 60, [0]), ("small", 3, [])]
    pipeline = Poisoned(str(tmp_path))
    run = pipeline.run(docs, store=store_url, progress=False, depth=1)
    got = run.collect()
    assert_audit_ok(store_url, run.run_id)
    assert isinstance(got[0], FailedResult)
    assert got[0].outcome is Outcome.SUPPRESSED
    assert got[1] == 3
    big_calls = [p for p in logged(tmp_path, "page") if p.startswith("big:")]
    assert big_calls[0] == "big:0!group"
    # At most the one sibling that was reserved alongside it ran; 58+ never dispatched.
    assert len(big_calls) <= 2, big_calls


class KillOnce:
    """SIGKILLs its own actor the first time it sees a record ending in ``kill``."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = Path(marker_dir)

    def __call__(self, lines: list[str]) -> list[Any]:
        for line in lines:
            if line.endswith("kill"):
                marker = self.marker_dir / f"killed-{line}"
                if not marker.exists():
                    marker.write_text(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGKILL)
        return [line.upper() for line in lines]


class SplitWords:
    def __call__(self, texts: list[str]) -> list[Any]:
        return [t.split() for t in texts]


class JoinWords:
    def __call__(self, words: list[list[str]]) -> list[Any]:
        return [" ".join(w) for w in words]


class Killer(ro.Pipeline):
    def __init__(self, marker_dir: str) -> None:
        super().__init__()
        self.split = ro.RayModule(SplitWords, num_cpus=0.1)
        self.work = ro.RayModule(KillOnce, marker_dir=marker_dir, num_cpus=0.1, batch_size=4)
        self.join = ro.RayModule(JoinWords, num_cpus=0.1)

    def forward(self, texts: Any) -> Any:
        return self.join(F.reduce(self.work(F.expand(self.split(texts)))))


def test_sigkilled_actor_gives_same_outputs_and_rejects_stale_commit(
    store_url: str, tmp_path: Path
) -> None:
    texts = ["a b c", "d e kill f g", "h"]
    run = Killer(str(tmp_path)).run(texts, store=store_url, progress=False)
    assert run.collect() == ["A B C", "D E KILL F G", "H"]
    assert list(tmp_path.glob("killed-*")), "the actor was never killed"

    store = open_store(store_url)
    facts = [s.fact for s in store.iter_facts(run.run_id, 0)]
    killed = ("work", (1, 2))  # the Grain of "kill"
    retried = [f for f in facts if isinstance(f, GrainRetried) and (f.call, f.path) == killed]
    committed = [f for f in facts if isinstance(f, GrainCommitted) and (f.call, f.path) == killed]
    assert [f.generation for f in retried] == [1]
    assert "died" in retried[0].cause
    assert [f.generation for f in committed] == [1]
    # The killed attempt's report, arriving late, is rejected and changes nothing.
    stale = GrainCommitted("work", (1, 2), 0, "present", ("KILL",))
    before = len(facts)
    assert store.commit(run.run_id, [stale]) == [CommitVerdict.SEALED]
    assert len(list(store.iter_facts(run.run_id, 0))) == before
    assert_audit_ok(store_url, run.run_id)


class Flaky:
    """Fails physically on the first attempt of records in ``flaky``; ``never`` always fails."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = Path(marker_dir)

    def __call__(self, xs: list[int]) -> list[int]:
        for x in xs:
            if x == 7:
                raise ValueError("seven is never accepted")
            marker = self.marker_dir / f"flaky-{x}"
            if x % 5 == 0 and not marker.exists():
                marker.write_text("x")
                raise ConnectionError(f"transient failure on {x}")
            if x == 11 and not (self.marker_dir / "slow-11").exists():
                (self.marker_dir / "slow-11").write_text("x")
                time.sleep(60)
        return [x * 10 for x in xs]


class Retries(ro.Pipeline):
    def __init__(self, marker_dir: str) -> None:
        super().__init__()
        self.work = ro.RayModule(
            Flaky, marker_dir=marker_dir, num_cpus=0.1, replicas=2, batch_size=2,
            max_attempts=3, timeout_s=3.0,
        )

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


def test_exceptions_and_timeouts_are_retried_then_failed(tmp_path: Path, ray_local: None) -> None:
    xs = list(range(14))
    run = Retries(str(tmp_path)).run(xs, store="memory://", progress=False)
    got = run.collect()
    for x, value in zip(xs, got):
        if x == 7:
            assert isinstance(value, FailedResult)
            assert value.outcome is Outcome.FAILED
            assert "seven is never accepted" in (value.cause or "")
        else:
            assert value == x * 10, (x, value)
    assert (tmp_path / "slow-11").exists()
    # Exceptions are handled inside the actor (no GrainRetried, no new actor); the batch
    # that hung past timeout_s is retried on a fresh actor.
    assert run.stats.call("work").retried >= 1
    assert run.actors_replaced >= 1


class WhichGpu:
    def __call__(self, xs: list[int]) -> list[Any]:
        import ray

        return [(x, tuple(ray.get_gpu_ids())) for x in xs]


class OnGpus(ro.Pipeline):
    def __init__(self, num_gpus: float, replicas: int) -> None:
        super().__init__()
        self.gpu = ro.RayModule(WhichGpu, num_gpus=num_gpus, replicas=replicas, num_cpus=0.1)

    def forward(self, xs: Any) -> Any:
        return self.gpu(xs)


def test_gpu_pools_are_scheduled_on_declared_gpus(ray_local: None) -> None:
    handle = OnGpus(1, 2).run(list(range(20)), progress=False)
    got = handle.collect()
    # Two replicas: the first one up may serve all 20 before the second is; actors_up_at
    # stays None while one starts (the run does not wait for it).
    assert handle.actors_up_at is None or handle.actors_up_at <= time.monotonic()
    assert [x for x, _ in got] == list(range(20))
    gpus = {ids for _, ids in got}
    assert all(len(ids) == 1 for ids in gpus)
    assert {ids[0] for ids in gpus} <= {0, 1}
    one = OnGpus(1, 1).run([1, 2], progress=False)
    one.collect()  # one replica: it served, so it was up
    assert one.actors_up_at is not None and one.actors_up_at <= time.monotonic()
    with pytest.raises(PoolError, match="GPU: 3 needed, 2 available"):
        OnGpus(1, 3).run([1], progress=False)


class NoModel:
    def __init__(self) -> None:
        raise FileNotFoundError("no model weights at /models/absent")

    def __call__(self, xs: list[int]) -> list[int]:
        return xs


class BadConfig:
    """Raises as pydantic does: the first line counts, the next ones say what is wrong."""

    def __init__(self) -> None:
        raise ValueError("1 validation error for ModelConfig\n  Value error, max_model_len "
                         "(16384) is greater than the model's own limit (2048). [type=value_error]")

    def __call__(self, xs: list[int]) -> list[int]:
        return xs


class SlowToStart:
    """The second replica to start takes 20 s to build."""

    def __init__(self, marker_dir: str) -> None:
        try:
            os.mkdir(os.path.join(marker_dir, "first"))
        except FileExistsError:
            time.sleep(20.0)

    def __call__(self, xs: list[int]) -> list[tuple[int, int]]:
        return [(x, os.getpid()) for x in xs]


class Twice:
    def __call__(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]


class Stages(ro.Pipeline):
    def __init__(self, target: Any, replicas: int = 1, **kwargs: Any) -> None:
        super().__init__()
        self.ok = ro.RayModule(Twice, num_cpus=0.1)
        self.stage = ro.RayModule(target, num_cpus=0.1, replicas=replicas, batch_size=1,
                                  **kwargs)

    def forward(self, xs: Any) -> Any:
        return self.stage(self.ok(xs))


@pytest.mark.timeout(120)
def test_a_module_that_cannot_be_built_is_one_clear_error(ray_local: None) -> None:
    """The run starts while its actors start; a constructor that raises ends it with one
    PoolError naming the module and the cause (no retries, no per-source failures)."""
    handle = Stages(NoModel).run(list(range(6)), progress=False, quiet=True)
    with pytest.raises(PoolError, match=r"^building module .stage. in its actor failed: "
                       r"FileNotFoundError: no model weights at /models/absent; check"):
        handle.collect()
    assert handle.actors_replaced == 0


@pytest.mark.timeout(120)
def test_a_constructor_errors_detail_lines_stay_in_the_pool_error(ray_local: None) -> None:
    handle = Stages(BadConfig).run(list(range(2)), progress=False, quiet=True)
    with pytest.raises(PoolError) as info:
        handle.collect()
    assert str(info.value).count("\n") == 0
    assert ("ValueError: 1 validation error for ModelConfig Value error, max_model_len (16384) "
            "is greater than the model's own limit (2048).") in str(info.value)


@pytest.mark.timeout(120)
def test_batches_go_to_the_replica_that_is_up(ray_local: None, tmp_path: Path) -> None:
    """Of two replicas, one takes 20 s to start: every batch runs on the other one, and
    the run ends before the slow one is up (an event, not a clock reading)."""
    handle = Stages(SlowToStart, replicas=2, marker_dir=str(tmp_path)).run(
        list(range(8)), progress=False, quiet=True)
    got = handle.collect()
    assert [x for x, _ in got] == [2 * x for x in range(8)]
    assert len({pid for _, pid in got}) == 1
    assert handle.actors_up_at is None  # the run ended before its last actor was up


LATE_S = 4.0
"""The start-up limit of the unschedulable-replica test: long enough for a schedulable actor
to start on a loaded machine; the run itself outlasts it by construction (see OnGpuUntil)."""


class OnGpuUntil:
    """A GPU stage whose first batch returns only ``outlast_s`` after its actor was built, so
    the run is still going when the other replica's start-up limit passes, however slowly
    the machine runs."""

    def __init__(self, outlast_s: float) -> None:
        self.until = time.monotonic() + outlast_s

    def __call__(self, xs: list[int]) -> list[int]:
        time.sleep(max(0.0, self.until - time.monotonic()))
        return xs


class OnlyStage(ro.Pipeline):
    def __init__(self, target: Any, replicas: int = 1, **kwargs: Any) -> None:
        super().__init__()
        self.stage = ro.RayModule(target, num_cpus=0.1, replicas=replicas, batch_size=1,
                                  **kwargs)

    def forward(self, xs: Any) -> Any:
        return self.stage(xs)


class GpuHolder:
    def ping(self) -> int:
        return os.getpid()


@pytest.mark.long
@pytest.mark.timeout(120)
def test_a_replica_that_cannot_be_scheduled_is_said_and_the_others_serve(
    ray_local: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Another job holds one of the two GPUs: of the pool's two GPU replicas one never
    starts. The run ends on the other, with one line saying so; with both GPUs held, no
    replica starts and the run ends with the PoolError that names the resources."""
    import ray

    monkeypatch.setenv("RAYORCH_ACTOR_START_TIMEOUT_S", str(LATE_S))
    holder = ray.remote(num_gpus=1, num_cpus=0)(GpuHolder).remote()
    ray.get(holder.ping.remote())
    try:
        handle = OnlyStage(OnGpuUntil, replicas=2, num_gpus=1, outlast_s=LATE_S + 1).run(
            list(range(8)), progress=False, quiet=True)
        assert handle.collect() == list(range(8))
        err = capfd.readouterr().err
        assert err.count(f"of module 'stage' is not up {LATE_S:g}s after its start") == 1, err
        # Both GPUs held by another job: the run waits for one (and says so) instead of
        # failing, and runs once the GPU is given back.
        second = ray.remote(num_gpus=1, num_cpus=0)(GpuHolder).remote()
        ray.get(second.ping.remote())
        got: list[Any] = []
        waiting = threading.Thread(target=lambda: got.extend(OnlyStage(
            OnGpuUntil, num_gpus=1, outlast_s=0).run([1], progress=False, quiet=True).collect()))
        waiting.start()
        err = wait_for_stderr(capfd, "waiting for the cluster to place", waiting)
        assert "modules 'stage': 0.1 CPU" in err and "1 GPU (0 of 2 free)" in err, err
        ray.kill(second)
        waiting.join(120)
        assert got == [1]
    finally:
        ray.kill(holder)


def test_wrong_inputs_are_refused_before_anything_runs() -> None:
    from rayorch.driver import DriverError

    with pytest.raises(DriverError, match="takes 1 input"):
        Nested().run([1, 2], [3, 4])
    with pytest.raises(DriverError, match="different lengths"):
        OnTwo().run([1], [2, 3])


class Pair:
    def __call__(self, xs: list[int], ys: list[int]) -> list[int]:
        return [x + y for x, y in zip(xs, ys)]


class OnTwo(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.pair = ro.RayModule(Pair, num_cpus=0.1)

    def forward(self, xs: Any, ys: Any) -> Any:
        return self.pair(xs, ys)


def test_two_inputs_and_redacted_store_url(ray_local: None) -> None:
    from rayorch.runtime.session import redact_url

    assert OnTwo().run([1, 2, 3], [10, 20, 30], progress=False).collect() == [11, 22, 33]
    assert redact_url("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


def wait_for_stderr(capfd: pytest.CaptureFixture[str], text: str, run: threading.Thread,
                    bound_s: float = 120) -> str:
    """Stderr up to the line holding ``text`` (or the run's end): an event, with a bound."""
    err = ""
    deadline = time.monotonic() + bound_s
    while text not in err and run.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        err += capfd.readouterr().err
    return err


class HangsOnFive:
    """Source 5's batch hangs until the test lets it go (a UDF without timeout_s)."""

    def __init__(self, release: str) -> None:
        self.release = Path(release)

    def __call__(self, xs: list[int]) -> list[int]:
        while 5 in xs and not self.release.exists():
            time.sleep(0.05)
        return xs


@pytest.mark.timeout(180)
def test_a_batch_that_hangs_is_said_on_stderr_naming_module_and_time(
    ray_local: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """No timeout_s: the run goes on waiting, but the hung batch is said (once its run time
    passes $RAYORCH_STALL_WARN_S and ten times its module's recent batches), with the way
    out; then the batch ends and every output arrives."""
    monkeypatch.setenv("RAYORCH_STALL_WARN_S", "1")
    release = tmp_path / "release"
    got: list[Any] = []
    run = threading.Thread(target=lambda: got.extend(
        OnlyStage(HangsOnFive, release=str(release)).run(list(range(8)), progress=False,
                                                         quiet=True).collect()))
    run.start()
    err = wait_for_stderr(capfd, "has run", run)
    release.write_text("go")
    run.join(120)
    assert got == list(range(8))
    said = [line for line in err.splitlines() if "has run" in line]
    assert said, err
    assert said[0].startswith("rayorch: batch ") and "of module 'stage' (1 records" in said[0]
    assert "it may hang: set timeout_s on the module" in said[0], said[0]
    assert "RAYORCH_STALL_WARN_S" in said[0]


class TwoCpus:
    def __call__(self, xs: list[int]) -> list[int]:
        return [x + 1 for x in xs]


class TwoStages(ro.Pipeline):
    """Two modules of 2 CPUs each: a run needs 4 of the session Ray's 8 CPUs."""

    def __init__(self) -> None:
        super().__init__()
        self.first = ro.RayModule(TwoCpus, num_cpus=2)
        self.second = ro.RayModule(TwoCpus, num_cpus=2)

    def forward(self, xs: Any) -> Any:
        return self.second(self.first(xs))


@pytest.mark.long
@pytest.mark.timeout(300)
def test_eight_concurrent_runs_that_each_fit_alone_all_complete(
    ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight runs at once, each fitting the cluster alone but not all together: each takes
    its first actors whole or waits its turn, so none holds half of what it needs."""
    monkeypatch.setenv("RAYORCH_ACTOR_START_TIMEOUT_S", "30")
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        try:
            results[i] = TwoStages().run([i, 10 * i], progress=False, quiet=True).collect()
        except Exception as exc:  # the assertion below names it
            results[i] = exc

    runs = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(280)
    assert results == {i: [i + 2, 10 * i + 2] for i in range(8)}, results


class SlowTwice:
    def __call__(self, xs: list[int]) -> list[int]:
        time.sleep(0.2)
        return [2 * x for x in xs]


class Slow(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.work = ro.RayModule(SlowTwice, num_cpus=0.1, batch_size=1)

    def forward(self, xs: Any) -> Any:
        return self.work(xs)


@pytest.mark.timeout(180)
def test_a_store_restarted_empty_mid_run_is_said_as_a_lost_run(
    ray_local: None, redis_server: Any
) -> None:
    """Redis comes back without its data while a run goes on: the driver stops with one line
    that says the store lost the run (and how to keep runs), not a kernel error about a
    Grain's phase, and hands out nothing more."""
    from rayorch.runtime.shard_leases import LineageLostError

    handle = Slow().run(list(range(40)), store=redis_server.url, progress=False, quiet=True)
    received = []
    with pytest.raises(LineageLostError, match=r"the lineage store lost run .* it holds no "
                       r"record of the run .* run Redis with appendonly yes"):
        for index, _ in handle:
            received.append(index)
            if len(received) == 3:
                redis_server.kill()  # no persistence: it starts again empty
                redis_server.start()
    assert 3 <= len(received) < 40
