"""Fault-injection harness: drivers and callers under SIGKILL, SIGSTOP, lost replies and
Redis restarts.

Two kinds of run share one local Ray cluster (``ray.init`` here; every process joins it
with ``--address``) and one private redis-server with AOF:

* **replicas**: a real nested fan-out pipeline (doc -> long-tailed pages -> regions ->
  sleep-modelled "GPU" OCR, a pool that sizes itself between 1 and 4 actors through the
  pool ledger -> reduce -> reduce) run by 2-3 ``rayorch driver`` processes
  with a file sink. The harness SIGKILLs drivers (and starts replacements), SIGKILLs
  pool actors, SIGSTOPs a driver past its lease TTL and SIGCONTs it (a *deposed wake-up*
  when another driver took one of its shards meanwhile) and kills and restarts Redis.
* **callers** (``bench/fault_callers.py``, in a thread): ``Pipeline.run`` callers
  (``bench/caller_run.py``), ordered and unordered, SIGKILLed at random points or
  SIGSTOPped past their lease TTL, continued by ``rayorch resume RUN --out-dir D``
  (itself sometimes SIGKILLed and resumed again).

Several replica runs (``--runs``) and several caller threads (``--caller-threads``) run at
once, sharing the Ray cluster and the store. A *rollback* (``--rollbacks``) SIGKILLs Redis
and cuts the last second of its AOF off before the restart, as an OS crash under
``appendfsync everysec`` does: the drivers must notice the store went back, rebuild and
adopt what their part files already hold.

Half of the processes reach Redis through a :class:`rayorch.testing.ReplyDroppingProxy`
that keeps losing replies to commits (workers) and fenced appends (drivers). At the end
the outputs (sink files plus what the callers printed) are checked against the reference
interpreter, every run against ``rayorch audit`` (with the file-sink delivery checks),
and it prints the faults by kind, outputs lost and outputs duplicated beyond the one
re-delivery a killed caller may cause (both must be 0), Grains re-run and recovery per
failover.

    python -m bench.faults               # a short run (a minute or two)
    python -m bench.faults --soak        # 2 x 2000 docs + 2 x 15 caller runs, rollbacks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rayorch as ro
from bench.fault_report import report
from rayorch import F
from rayorch.testing import RedisServer, ReplyDroppingProxy

REPO = Path(__file__).resolve().parents[1]
DRIVER_KILLS = ("driver SIGKILL", "caller SIGKILL", "resume SIGKILL")
DEPOSED = ("deposed wake-up (driver)", "deposed wake-up (caller)")


# -- the pipeline (module level: drivers import it as bench.faults:FaultPipeline) ---------
def _note_pid(pid_dir: str | None, module: str) -> None:
    """Record this actor's pid so the harness can SIGKILL it."""
    if pid_dir:
        Path(pid_dir, f"{module}-{os.getpid()}").touch()


def pages_of(doc: str) -> int:
    """Long-tailed page count (1..40), deterministic per document."""
    rng = random.Random(doc)
    return min(40, int(rng.paretovariate(1.1)))


class SplitDoc:
    def __init__(self, pid_dir: str | None = None) -> None:
        _note_pid(pid_dir, "split")

    def __call__(self, docs: list[str]) -> list[Any]:
        out: list[Any] = []
        for doc in docs:
            if doc.endswith("!bad"):
                out.append(ro.RecordFailure(f"unreadable: {doc}"))
            else:
                out.append([f"{doc}/p{p}" for p in range(pages_of(doc))])
        return out


class SplitPage:
    def __init__(self, pid_dir: str | None = None) -> None:
        _note_pid(pid_dir, "regions")

    def __call__(self, pages: list[str]) -> list[Any]:
        return [[f"{page}/r{r}" for r in range(1 + len(page) % 3)] for page in pages]


class SleepGpu:
    """A GPU stage modelled as ``a + b * batch`` seconds of sleep."""

    def __init__(self, a_ms: float = 20.0, b_ms: float = 2.0, pid_dir: str | None = None) -> None:
        self.a, self.b = a_ms / 1000, b_ms / 1000
        _note_pid(pid_dir, "ocr")

    def __call__(self, regions: list[str]) -> list[str]:
        time.sleep(self.a + self.b * len(regions))
        return [r.upper() for r in regions]


class JoinRegions:
    def __init__(self, pid_dir: str | None = None) -> None:
        _note_pid(pid_dir, "join")

    def __call__(self, groups: list[list[str]]) -> list[str]:
        return ["+".join(g) for g in groups]


class Assemble:
    def __init__(self, pid_dir: str | None = None) -> None:
        _note_pid(pid_dir, "assemble")

    def __call__(self, docs: list[list[str]]) -> list[dict[str, Any]]:
        return [{"pages": len(pages), "text": "|".join(pages)} for pages in docs]


class FaultPipeline(ro.Pipeline):
    """doc -> pages (long tail) -> regions -> OCR ("GPU") -> page text -> document."""

    def __init__(self, gpu_ms: float = 20.0, pid_dir: str | None = None,
                 max_attempts: int = 1000) -> None:
        super().__init__()
        common: dict[str, Any] = {"num_cpus": 0.25, "max_attempts": max_attempts,
                                  "pid_dir": pid_dir}
        self.split = ro.RayModule(SplitDoc, batch_size=4, **common)
        self.regions = ro.RayModule(SplitPage, batch_size=16, **common)
        self.ocr = ro.RayModule(SleepGpu, a_ms=gpu_ms, b_ms=gpu_ms / 10, replicas=(1, 4),
                                batch_size=16, num_gpus=0.5, pid_dir=pid_dir,
                                max_attempts=max_attempts, num_cpus=0.25)
        self.join = ro.RayModule(JoinRegions, batch_size=16, **common)
        self.assemble = ro.RayModule(Assemble, batch_size=4, **common)

    def forward(self, docs: Any) -> Any:
        pages = F.expand(self.split(docs))
        regions = F.expand(self.regions(pages))
        texts = self.ocr(regions)
        return self.assemble(F.reduce(self.join(F.reduce(texts))))


class PacedWork:
    """Sleeps ``slow_s`` for an item starting with "slow", ``each_s`` for the others."""

    def __init__(self, slow_s: float = 4.0, each_s: float = 0.0) -> None:
        self.slow_s, self.each_s = slow_s, each_s

    def __call__(self, items: list[str]) -> list[str]:
        out = []
        for item in items:
            time.sleep(self.slow_s if item.startswith("slow") else self.each_s)
            out.append(f"done:{item}")
        return out


class PacedPipeline(ro.Pipeline):
    """One Call whose pace the caller sets per item: the caller-path fault tests' pipeline."""

    def __init__(self, slow_s: float = 4.0, each_s: float = 0.0) -> None:
        super().__init__()
        self.work = ro.RayModule(PacedWork, slow_s=slow_s, each_s=each_s, batch_size=1,
                                 replicas=2, num_cpus=0.25)

    def forward(self, items: Any) -> Any:
        return self.work(items)


def make_docs(n: int) -> list[str]:
    return [f"doc{i}" + ("!bad" if i % 23 == 7 else "") for i in range(n)]


# -- processes ------------------------------------------------------------------------------
@dataclass
class DriverProc:
    driver_id: str
    proc: subprocess.Popen[bytes]
    run_id: str
    stopped: bool = False


@dataclass
class Harness:
    """One fault-injection run; see the module docstring."""

    docs: int = 40
    drivers: int = 2
    shards: int = 6
    micro_batch: int = 2
    driver_kills: int = 2
    actor_kills: int = 4
    stops: int = 1
    redis_restarts: int = 1
    rollbacks: int = 0  # Redis SIGKILLed with the last second of its AOF cut off (an OS crash)
    runs: int = 1  # replica runs at once, sharing the cluster and the store
    caller_threads: int = 1  # caller episodes at once (each thread plays its own series)
    gpu_ms: float = 20.0
    lease_ttl: float = 3.0
    interval: float = 3.0
    timeout: float = 600.0
    seed: int = 0
    caller_kills: int = 1
    caller_stops: int = 1
    caller_items: int = 24
    resume_kill_p: float = 0.3
    reply_interval: float = 1.0  # seconds between lost replies (0: no proxy)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rofaults-")))
    verbose: bool = False
    faults: Counter[str] = field(default_factory=Counter)
    kills_of: dict[str, list[tuple[float, str, list[int]]]] = field(default_factory=dict)
    rollbacks_at: list[float] = field(default_factory=list)
    procs: list[DriverProc] = field(default_factory=list)
    _n: int = 0
    _proxy_url: str | None = None

    def log(self, line: str) -> None:
        print(f"[faults {time.strftime('%H:%M:%S')}] {line}", flush=True)

    # -- drivers -------------------------------------------------------------------------
    def spawn_driver(self, run_id: str, url: str, address: str) -> None:
        from bench.fault_callers import child_env

        self._n += 1
        driver_id = f"d{self._n}"
        if self._proxy_url and self._n % 2 == 1:  # d1 (which makes the shared pools), d3, ...
            url = self._proxy_url
        env = child_env()
        out = open(self.workdir / f"{driver_id}.log", "wb")  # noqa: SIM115 - owned by Popen
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url,
             "--address", address, "--driver-id", driver_id, "--lease-ttl", str(self.lease_ttl)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.procs.append(DriverProc(driver_id, proc, run_id))

    def live(self, run_id: str | None = None) -> list[DriverProc]:
        return [p for p in self.procs if p.proc.poll() is None
                and (run_id is None or p.run_id == run_id)]

    def run(self) -> dict[str, Any]:
        import ray

        from bench.faults import FaultPipeline as Importable
        from rayorch.replicas import create_run
        from rayorch.store import open_store

        rng = random.Random(self.seed)
        redis = RedisServer(self.workdir, aof=True, start_timeout_s=20.0)
        redis.start()
        pid_dir = self.workdir / "pids"
        pid_dir.mkdir()
        out_dirs = [self.workdir / ("out" if i == 0 else f"out{i}") for i in range(self.runs)]
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Each replica run's OCR pool asks for 1 GPU (2 x 0.5): one per run.
        ray.init(address="local", num_cpus=8, num_gpus=max(2, self.runs),
                 include_dashboard=False, log_to_driver=self.verbose,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        address = ray.get_runtime_context().gcs_address
        docs = make_docs(self.docs)
        from bench.fault_callers import CallerPaths, ReplyDropper

        dropper: ReplyDropper | None = None
        if self.reply_interval > 0:
            dropper = ReplyDropper(ReplyDroppingProxy(redis.port), self.reply_interval, self.seed)
            self._proxy_url = f"redis://127.0.0.1:{dropper.proxy.port}/0"
        callers = [CallerPaths(direct_url=redis.url, proxy_url=self._proxy_url, address=address,
                               workdir=self.workdir, seed=self.seed + 1000 * i,
                               items=self.caller_items, kills=self.caller_kills,
                               stops=self.caller_stops, resume_kill_p=self.resume_kill_p,
                               lease_ttl=2.0, log=self.log,
                               prefix="caller" if i == 0 else f"caller{chr(97 + i)}")
                   for i in range(self.caller_threads)]
        threads = [threading.Thread(target=c.run, name=f"callers-{i}", daemon=True)
                   for i, c in enumerate(callers)]
        try:
            run_ids = [create_run(Importable, [docs], store=redis.url,
                                  kwargs={"gpu_ms": self.gpu_ms, "pid_dir": str(pid_dir)},
                                  out_dir=str(out), shards=self.shards,
                                  micro_batch=self.micro_batch, max_active_sources=8)
                       for out in out_dirs]
            store = open_store(redis.url + "?retries=40")
            self.log(f"run{'s' if self.runs > 1 else ''} {', '.join(run_ids)}: {self.docs} "
                     f"docs, {self.shards} shards, {self.drivers} drivers each, "
                     f"{self.caller_threads} caller thread(s), logs in {self.workdir}")
            started = time.monotonic()
            if dropper is not None:
                dropper.start()
            for run_id in run_ids:
                for _ in range(self.drivers):
                    self.spawn_driver(run_id, redis.url, address)
            for thread in threads:
                thread.start()
            self._inject(rng, store, run_ids, redis, pid_dir, out_dirs, address, started,
                         threads)
            elapsed = time.monotonic() - started
            if dropper is not None:
                dropper.close()
                self.faults.update(dropper.counts())
            for c in callers:
                self.faults.update(c.faults)
            return self._check(store, run_ids, out_dirs, docs, elapsed, callers)
        finally:
            if dropper is not None:
                dropper.close()
            for p in self.procs:
                if p.proc.poll() is None:
                    if p.stopped:
                        p.proc.send_signal(signal.SIGCONT)
                    p.proc.kill()
                    p.proc.wait(10)
            ray.shutdown()
            redis.stop()

    # -- faults ----------------------------------------------------------------------------
    def _inject(self, rng: random.Random, store: Any, run_ids: list[str], redis: RedisServer,
                pid_dir: Path, out_dirs: list[Path], address: str, started: float,
                callers: list[threading.Thread]) -> None:
        """Inject the replica faults until the replica runs are done (Redis restarts until
        the caller episodes are done too)."""
        from rayorch.store.errors import StoreUnavailableError

        todo = (["driver"] * self.driver_kills + ["actor"] * self.actor_kills
                + ["stop"] * self.stops + ["redis"] * self.redis_restarts
                + ["rollback"] * self.rollbacks)
        rng.shuffle(todo)
        shards = store.run_info(run_ids[0]).shards
        next_fault = time.monotonic() + self.interval
        done: set[str] = set()
        while time.monotonic() - started < self.timeout:
            for run_id in run_ids:
                with contextlib.suppress(StoreUnavailableError):
                    if len(store.done_shards(run_id)) == shards:
                        done.add(run_id)
                live = self.live(run_id)
                if run_id not in done and (not live or all(p.stopped for p in live)):
                    failed = [p for p in self.procs if p.run_id == run_id
                              and (p.proc.poll() or 0) > 0]  # not the harness's SIGKILLs
                    if len(failed) > 10:
                        raise SystemExit(f"run {run_id}: {len(failed)} drivers exited with an "
                                         f"error (logs in {self.workdir}, e.g. "
                                         f"{failed[-1].driver_id}.log)")
                    self.spawn_driver(run_id, redis.url, address)
            if len(done) == len(run_ids):
                todo = [kind for kind in todo if kind in ("redis", "rollback")]
                if not any(thread.is_alive() for thread in callers):
                    break
            if todo and time.monotonic() >= next_fault:
                kind = todo.pop()
                self._fault(kind, rng, store, redis, pid_dir, address)
                gap = min(self.interval, self._time_left(started, out_dirs) / (len(todo) + 1))
                next_fault = time.monotonic() + rng.uniform(0.5, 1.5) * max(0.3, gap)
            time.sleep(0.1)
        else:
            raise SystemExit(f"the runs did not complete within {self.timeout:.0f}s "
                             f"(logs in {self.workdir})")
        if todo:
            self.log(f"run completed before {len(todo)} faults could be injected")
        deadline = time.monotonic() + 60
        for p in self.procs:
            if p.stopped:
                p.proc.send_signal(signal.SIGCONT)
                p.stopped = False
            if p.proc.poll() is None:
                p.proc.wait(max(1.0, deadline - time.monotonic()))

    def _time_left(self, started: float, out_dirs: list[Path]) -> float:
        """A guess of the runs' remaining time (from the outputs written so far), times 0.8,
        so that the planned faults fit in the runs."""
        from rayorch.runtime.sinks import delivered_count

        done = sum(delivered_count(out) for out in out_dirs)
        if done < 5:
            return float("inf")
        elapsed = time.monotonic() - started
        return 0.8 * elapsed * (self.docs * len(out_dirs) - done) / done

    def _held(self, store: Any, run_id: str, driver_id: str) -> list[int]:
        return [k for k in range(store.run_info(run_id).shards)
                if (h := store.lease_holder(run_id, k)) is not None and h.driver == driver_id]

    def _fault(self, kind: str, rng: random.Random, store: Any, redis: RedisServer,
               pid_dir: Path, address: str) -> None:
        live = [p for p in self.live() if not p.stopped]
        if kind == "driver" and live:
            victim = rng.choice(live)
            run_id = victim.run_id
            held = self._held(store, run_id, victim.driver_id)
            victim.proc.kill()
            victim.proc.wait(10)
            self.kills_of.setdefault(run_id, []).append((time.time(), victim.driver_id, held))
            self.faults["driver SIGKILL"] += 1
            self.log(f"SIGKILL driver {victim.driver_id} (held shards {held})")
            self.spawn_driver(run_id, redis.url, address)
        elif kind == "actor":
            pids = [int(f.name.rsplit("-", 1)[1]) for f in pid_dir.iterdir()]
            alive = [pid for pid in pids if _alive(pid)]
            if alive:
                pid = rng.choice(alive)
                os.kill(pid, signal.SIGKILL)
                self.faults["actor SIGKILL"] += 1
                self.log(f"SIGKILL actor pid {pid}")
        elif kind == "stop" and len(live) > 1:
            holders = {h.driver for run_id in {p.run_id for p in live}
                       for k in range(store.run_info(run_id).shards)
                       if (h := store.lease_holder(run_id, k)) is not None}
            victim = rng.choice([p for p in live if p.driver_id in holders] or live)
            run_id = victim.run_id
            held = self._held(store, run_id, victim.driver_id)
            victim.proc.send_signal(signal.SIGSTOP)
            victim.stopped = True
            self.faults["driver SIGSTOP/SIGCONT"] += 1
            pause = 2.5 * self.lease_ttl
            self.log(f"SIGSTOP driver {victim.driver_id} for {pause:.1f}s (held shards {held})")

            def resume() -> None:
                # Deposed: another driver holds (or finished) a shard it held when stopped.
                with contextlib.suppress(Exception):
                    done = store.done_shards(run_id)
                    taken = [k for k in held if k in done or (
                        (h := store.lease_holder(run_id, k)) is not None
                        and h.driver != victim.driver_id)]
                    if taken and victim.proc.poll() is None:
                        self.faults["deposed wake-up (driver)"] += 1
                if victim.proc.poll() is None:
                    victim.proc.send_signal(signal.SIGCONT)
                victim.stopped = False
                self.log(f"SIGCONT driver {victim.driver_id}")

            threading.Timer(pause, resume).start()
        elif kind == "rollback":
            # appendfsync everysec (docs/DEPLOYING.md) loses up to its last second in an OS
            # crash: keep the AOF's size now, go on for a second, kill, cut it back, restart.
            aof = sorted((redis.workdir / "appendonlydir").glob("*.incr.aof"))
            size = aof[-1].stat().st_size if aof else 0
            time.sleep(1.0)
            redis.kill()
            now = sorted((redis.workdir / "appendonlydir").glob("*.incr.aof"))
            if aof and now and now[-1] == aof[-1]:
                lost = aof[-1].stat().st_size - size
                with open(aof[-1], "r+b") as f:
                    f.truncate(size)
                self.faults["redis rollback (last second of its AOF lost)"] += 1
                self.rollbacks_at.append(time.time())
                self.log(f"SIGKILL redis-server, its AOF cut back by {lost} bytes (1 s), restart")
            else:
                self.faults["redis kill+restart"] += 1  # the AOF was rewritten meanwhile
                self.log("SIGKILL redis-server (AOF rewritten meanwhile: not cut), restart")
            redis.start()
        elif kind == "redis":
            redis.kill()
            down = rng.uniform(1.0, 3.0)
            self.faults["redis kill+restart"] += 1
            self.log(f"SIGKILL redis-server, restart in {down:.1f}s")
            time.sleep(down)
            redis.start()

    # -- checks ------------------------------------------------------------------------------
    def _check(self, store: Any, run_ids: list[str], out_dirs: list[Path], docs: list[str],
               elapsed: float, callers: list[Any]) -> dict[str, Any]:
        from bench.fault_report import replica_outcome

        outcomes = [replica_outcome(store, run_id, out, docs, self.kills_of.get(run_id, []))
                    for run_id, out in zip(run_ids, out_dirs)]
        problems = [p for o in outcomes for p in o["problems"]]
        retried: Counter[str] = sum((o["retried"] for o in outcomes), Counter())
        episodes = [ep for c in callers for ep in c.episodes]
        for c in callers:
            for ep in c.episodes:
                problems += ep.problems + c.audit(ep)
            if c.error:
                problems.append(f"caller episodes: {c.error}")
        if len(episodes) < (self.caller_kills + self.caller_stops) * len(callers):
            problems.append(f"only {len(episodes)} caller episodes ran")
        # A caller killed in the second after a rollback, before its driver saw the store go
        # back, is resumed from a store that forgot its last acknowledgements.
        rolled = [ep for ep in episodes
                  if any(ep.started <= t <= ep.ended + 1.0 for t in self.rollbacks_at)]
        seen = sum(path.read_text(errors="replace").count("the lineage store went back on")
                   for pattern in ("*.log", "*.err") for path in self.workdir.glob(pattern))
        faults = self.faults
        return {
            "runs": run_ids, "docs": len(docs), "elapsed_s": round(elapsed, 1),
            "faults": dict(faults),
            "driver_kills": sum(faults[k] for k in DRIVER_KILLS),
            "deposed_wakeups": sum(faults[k] for k in DEPOSED),
            "lost_replies": sum(n for k, n in faults.items() if k.endswith("reply lost")),
            "redis_restarts": faults["redis kill+restart"],
            "rollbacks": faults["redis rollback (last second of its AOF lost)"],
            "rollbacks_seen": seen,
            "caller_runs": len(episodes), "caller_threads": len(callers),
            "caller_sources": self.caller_items * len(episodes),
            "caller_printed": sum(len(ep.printed) for ep in episodes),
            "caller_redelivered": sum(len(ep.redelivered) for ep in episodes),
            "caller_rolled_back": sum(ep.excess for ep in rolled),
            "resumes": sum(ep.resumes for ep in episodes),
            "outputs_lost": sum(len(o["lost"]) for o in outcomes)
            + sum(len(ep.lost) for ep in episodes),
            "outputs_duplicated": sum(len(o["duplicated"]) for o in outcomes)
            + sum(ep.excess for ep in episodes if ep not in rolled),
            "outputs_wrong": sum(len(o["wrong"]) for o in outcomes)
            + sum(len(ep.wrong) for ep in episodes),
            "grains_rerun": dict(retried),
            "recovery_s": [r for o in outcomes for r in o["recovery"]],
            "audit_ok": not problems,
            "audit_violations": problems[:20],
            "drivers_started": self._n, "workdir": str(self.workdir),
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak", action="store_true",
                        help="long soak defaults: 2 runs of 2000 docs, 3 drivers each, 2 x 15 "
                        "caller runs")
    parser.add_argument("--docs", type=int)
    parser.add_argument("--drivers", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--driver-kills", type=int)
    parser.add_argument("--actor-kills", type=int)
    parser.add_argument("--stops", type=int)
    parser.add_argument("--redis-restarts", type=int)
    parser.add_argument("--rollbacks", type=int,
                        help="Redis SIGKILLs that lose the last second of its AOF")
    parser.add_argument("--runs", type=int, help="replica runs at once (default 1)")
    parser.add_argument("--caller-threads", type=int,
                        help="caller episodes at once: each thread plays the caller kills and "
                        "stops (default 1)")
    parser.add_argument("--caller-kills", type=int, help="caller runs SIGKILLed, then resumed")
    parser.add_argument("--caller-stops", type=int,
                        help="caller runs SIGSTOPped past their lease, resumed, SIGCONTed")
    parser.add_argument("--caller-items", type=int, help="sources per caller run")
    parser.add_argument("--resume-kill-p", type=float,
                        help="chance that a resume is SIGKILLed (and resumed again)")
    parser.add_argument("--reply-interval", type=float,
                        help="seconds between lost replies (0: no reply-dropping proxy)")
    parser.add_argument("--interval", type=float, help="seconds between faults (mean)")
    parser.add_argument("--lease-ttl", type=float)
    parser.add_argument("--gpu-ms", type=float)
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the result as JSON to this file")
    parser.add_argument("--verbose", action="store_true", help="show Ray worker output")
    args = parser.parse_args(argv)
    base: dict[str, Any] = {}
    if args.soak:
        base = {"docs": 2000, "drivers": 3, "shards": 12, "driver_kills": 50,
                "actor_kills": 50, "stops": 5, "redis_restarts": 3, "rollbacks": 3, "interval": 2.5,
                "gpu_ms": 120.0, "timeout": 1500.0, "caller_kills": 9, "caller_stops": 6,
                "runs": 2, "caller_threads": 2}
    for name in ("docs", "drivers", "shards", "driver_kills", "actor_kills", "stops",
                 "redis_restarts", "rollbacks", "runs", "caller_threads", "caller_kills",
                 "caller_stops", "caller_items", "resume_kill_p", "reply_interval", "interval",
                 "lease_ttl", "gpu_ms", "timeout"):
        if getattr(args, name) is not None:
            base[name] = getattr(args, name)
    harness = Harness(seed=args.seed, verbose=args.verbose, **base)
    result = harness.run()
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = (result["outputs_lost"] == 0 and result["outputs_duplicated"] == 0
          and result["outputs_wrong"] == 0 and result["audit_ok"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
