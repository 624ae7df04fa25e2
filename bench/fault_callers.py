"""Caller-path episodes and reply loss for the fault harness (``bench/faults.py``).

One episode is one ``Pipeline.run`` caller (``python -m bench.caller_run``, its own run
of ``PacedPipeline`` on the harness's redis-server and Ray) that is either

* **killed** (SIGKILL) at a random point, ordered or unordered, and then continued by
  ``rayorch resume RUN --out-dir D`` — a resume that may itself be SIGKILLed and
  resumed again; or
* **deposed**: SIGSTOPped past its lease TTL, the run finished by ``rayorch resume``,
  then SIGCONTed: the woken caller must exit 3 with "lease lost" and hand its caller
  nothing more (docs/topics/FAILOVER.md, "Leases, holder tokens and rollback").

What the caller printed plus what the resumes wrote (``read_outputs``) must hold every
source, each once, except at most one source per interrupted caller: the one it held
when it died, which a resume delivers again (docs/ARCHITECTURE.md, "Delivery").

:class:`ReplyDropper` arms a :class:`rayorch.testing.ReplyDroppingProxy` over and over,
alternating the commit script (workers) and the fenced append script (drivers), so
that drivers and workers whose store URL is the proxy lose replies to writes that
happened.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLOW_S = 3.0  # item 0 of a --slow-first caller: the ordered caller buffers behind it
EACH_S = 0.3
START_TIMEOUT_S = 180.0


def child_env() -> dict[str, str]:
    """The environment of a driver or caller process: this checkout first on the path."""
    return dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
                RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


@functools.lru_cache(maxsize=4)
def reference(count: int, slow_first: bool) -> dict[int, Any]:
    """What the reference interpreter computes for each source of a caller run."""
    from bench.caller_run import items
    from bench.faults import PacedPipeline
    from rayorch.core.reference import evaluate

    rows = [(item,) for item in items(count, slow_first)]
    outputs = evaluate(PacedPipeline(slow_s=0, each_s=0).compile(), rows).outputs
    return {index: out[0].value if out[0].present else None for index, out in outputs.items()}


@dataclass
class Episode:
    """One caller episode and what it found."""

    run_id: str
    kind: str  # "kill" or "stop"
    ordered: bool
    slow_first: bool
    shards: int
    out_dir: Path
    printed: list[tuple[int, Any]] = field(default_factory=list)
    caller_exit: int | None = None
    caller_err: str = ""
    interrupted: bool = False  # killed or deposed: one re-delivery allowed
    deposed: bool = False
    after_wake: list[int] = field(default_factory=list)
    resumes: int = 0
    resume_kills: int = 0
    resume_failures: list[str] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    redelivered: list[int] = field(default_factory=list)
    excess: int = 0  # deliveries beyond the one allowed re-delivery
    wrong: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: str = ""
    started: float = 0.0  # wall clock: the caller's start ...
    ended: float = 0.0  # ... and the end of its process (killed, deposed or done)


class CallerPaths:
    """Runs caller episodes one after another (in a thread beside the replica runs; several
    such threads run concurrent callers)."""

    def __init__(self, *, direct_url: str, proxy_url: str | None, address: str,
                 workdir: Path, seed: int, items: int, kills: int, stops: int,
                 resume_kill_p: float, lease_ttl: float,
                 log: Callable[[str], None], prefix: str = "caller") -> None:
        self.direct_url, self.proxy_url, self.address = direct_url, proxy_url, address
        self.workdir = workdir
        self.rng = random.Random(seed * 7919 + 1)
        self.items = items
        self.plan = ["kill"] * kills + ["stop"] * stops
        self.rng.shuffle(self.plan)
        self.resume_kill_p = resume_kill_p
        self.lease_ttl = lease_ttl
        self.log = log
        self.prefix = prefix  # of its episodes' run ids (several threads may run at once)
        self.faults: Counter[str] = Counter()
        self.episodes: list[Episode] = []
        self.error: str | None = None
        self._store: Any = None

    # -- the thread ----------------------------------------------------------------------
    def run(self) -> None:
        from rayorch.store import open_store

        self._store = open_store(self.direct_url + "?retries=40")
        try:
            for n, kind in enumerate(self.plan):
                episode = self._episode(n, kind)
                self.episodes.append(episode)
        except Exception as exc:  # reported with the results, never swallowed
            import traceback

            self.error = "".join(traceback.format_exception(exc))[-3000:]
            self.log(f"caller episodes stopped by an error: {exc}")
        finally:
            self._store.close()

    def _url(self) -> str:
        return self.proxy_url if self.proxy_url and self.rng.random() < 0.5 else self.direct_url

    def _episode(self, n: int, kind: str) -> Episode:
        for attempt in range(3):
            ordered = self.rng.random() < 0.5
            episode = Episode(
                run_id=f"{self.prefix}{n}-{uuid.uuid4().hex[:6]}", kind=kind, ordered=ordered,
                slow_first=ordered and self.rng.random() < 0.5,
                shards=self.rng.choice([1, 2]), out_dir=self.workdir / f"{self.prefix}{n}-out")
            self._play(episode)
            if not episode.skipped:
                return episode
            self.log(f"caller episode {n} ({episode.run_id}) skipped: {episode.skipped}"
                     + ("; again" if attempt < 2 else ""))
        return episode

    # -- one episode -----------------------------------------------------------------------
    def _play(self, ep: Episode) -> None:
        url = self._url()
        log_out = self.workdir / f"{ep.run_id}.out"
        log_err = self.workdir / f"{ep.run_id}.err"
        cmd = [sys.executable, "-m", "bench.caller_run", "--store", url, "--run-id",
               ep.run_id, "--address", self.address, "--items", str(self.items), "--values",
               "--each-s", str(EACH_S), "--slow-s", str(SLOW_S), "--lease-ttl",
               str(self.lease_ttl), "--shards", str(ep.shards), "--micro-batch", "4"]
        if not ep.ordered:
            cmd.append("--unordered")
        if ep.slow_first:
            cmd.append("--slow-first")
        ep.started = time.time()
        with open(log_out, "wb") as out, open(log_err, "wb") as err:
            caller = subprocess.Popen(cmd, stdout=out, stderr=err, env=child_env(), cwd=REPO)
        # A stop late in the run often finds it finished before anyone could take over.
        point = self.rng.randint(0, self.items - 1 if ep.kind == "kill" else self.items // 2)
        how = "ordered" + (", slow first" if ep.slow_first else "") if ep.ordered else \
            "unordered"
        self.log(f"caller {ep.run_id} ({how}, {ep.shards} shard(s), "
                 f"{'proxy' if url != self.direct_url else 'direct'}): {ep.kind} after "
                 f"{point} commits")
        try:
            if not self._wait_point(ep, caller, point):
                return
            time.sleep(self.rng.uniform(0.0, 0.6))
            if ep.kind == "kill":
                self._kill(ep, caller, log_out)
            else:
                self._stop_and_wake(ep, caller, log_out, log_err)
        finally:
            if caller.poll() is None:
                caller.send_signal(signal.SIGCONT)
                caller.kill()
                caller.wait(10)
            ep.ended = time.time()
        ep.caller_err = _tail(log_err)
        if ep.skipped:
            return
        if ep.caller_exit not in (None, 0, 3, -signal.SIGKILL):
            ep.problems.append(f"caller exited {ep.caller_exit}: {ep.caller_err}")
        self._check(ep)

    def _wait_point(self, ep: Episode, caller: subprocess.Popen[bytes], point: int) -> bool:
        """Wait until the run holds ``point`` commits; False (skipped) if it never started."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            done = caller.poll()
            count = self._committed(ep.run_id)
            if done is not None:
                ep.caller_exit = done
                if count is None:  # e.g. the store was down while it opened the run
                    ep.skipped = f"the caller exited {done} before its run existed"
                    return False
                return True
            if count is not None and count >= point:
                return True
            time.sleep(0.1)
        ep.problems.append(f"the caller made no progress in {START_TIMEOUT_S:.0f}s")
        return True

    def _committed(self, run_id: str) -> int | None:
        from rayorch.core.facts import GrainCommitted
        from rayorch.store.errors import RunNotFoundError

        try:
            if self._store.load_manifest(run_id) is None:
                return None
            return sum(1 for facts in self._store.read_run(run_id, payloads=False).values()
                       for s in facts if isinstance(s.fact, GrainCommitted))
        except RunNotFoundError:
            return None

    def _kill(self, ep: Episode, caller: subprocess.Popen[bytes], log_out: Path) -> None:
        if caller.poll() is None:
            caller.kill()
            caller.wait(10)
            self.faults["caller SIGKILL"] += 1
        ep.caller_exit = caller.returncode
        ep.interrupted = ep.caller_exit != 0
        ep.printed = _printed(log_out)
        if ep.caller_exit != 0:
            self._resume(ep)

    def _stop_and_wake(self, ep: Episode, caller: subprocess.Popen[bytes], log_out: Path,
                       log_err: Path) -> None:
        if caller.poll() is not None:
            ep.caller_exit = caller.returncode
            ep.interrupted = ep.caller_exit != 0
            ep.printed = _printed(log_out)
            if ep.caller_exit != 0:
                self._resume(ep)
            return
        caller.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # what it wrote before the stop is in the file now
        before = _printed(log_out)
        time.sleep(self.lease_ttl * 1.5)  # past its lease TTL
        self._resume(ep)
        caller.send_signal(signal.SIGCONT)
        try:
            ep.caller_exit = caller.wait(90)
        except subprocess.TimeoutExpired:
            ep.problems.append("the woken caller did not exit within 90 s (hang)")
            caller.kill()
            ep.caller_exit = caller.wait(10)
        ep.printed = _printed(log_out)
        ep.after_wake = [i for i, _ in ep.printed[len(before):]]
        err = _tail(log_err)
        if ep.caller_exit == 3 and "lease lost" in err:
            ep.deposed = ep.interrupted = True
            self.faults["deposed wake-up (caller)"] += 1
        elif ep.caller_exit == 0 and self._took_over(ep.run_id) == 0:
            self.log(f"caller {ep.run_id} had finished before the resume took over")
        else:
            ep.interrupted = True
            ep.problems.append(f"the woken caller exited {ep.caller_exit}, not 3 with "
                               f"'lease lost': {err}")
        # The line it was printing when stopped may come after the wake-up: one at most.
        if len(ep.after_wake) > 1:
            ep.problems.append(f"the deposed caller handed out {ep.after_wake} after waking")

    def _took_over(self, run_id: str) -> int:
        """LeaseAcquired facts of drivers other than the run's first (the resumes)."""
        from rayorch.core.facts import LeaseAcquired

        drivers = [s.fact.driver for facts in self._store.read_run(run_id, payloads=False)
                   .values() for s in facts if isinstance(s.fact, LeaseAcquired)]
        return sum(1 for d in drivers if drivers and d != drivers[0])

    def _resume(self, ep: Episode) -> None:
        """``rayorch resume`` until it completes the run; some attempts SIGKILLed."""
        for attempt in range(8):
            url = self._url()
            err_path = self.workdir / f"{ep.run_id}.resume{attempt}.err"
            cmd = [sys.executable, "-m", "rayorch.cli", "resume", ep.run_id, "--store", url,
                   "--address", self.address, "--out-dir", str(ep.out_dir), "--lease-ttl",
                   str(self.lease_ttl), "--driver-id", f"{ep.run_id}-r{attempt}"]
            with open(err_path, "wb") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                        env=child_env(), cwd=REPO)
            ep.resumes += 1
            if ep.resume_kills < 2 and self.rng.random() < self.resume_kill_p:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.rng.uniform(1.0, 8.0))
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
                    ep.resume_kills += 1
                    self.faults["resume SIGKILL"] += 1
                    self.log(f"SIGKILL resume {attempt} of {ep.run_id}")
                    continue
            try:
                code = proc.wait(START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                ep.problems.append(f"resume {attempt} did not finish in {START_TIMEOUT_S:.0f}s")
                return
            if code == 0:
                return
            ep.resume_failures.append(f"exit {code}: {_tail(err_path)}")
            self.log(f"resume {attempt} of {ep.run_id} exited {code}: {_tail(err_path)}")
            time.sleep(1.0)
        ep.problems.append(f"no resume completed the run: {ep.resume_failures[-3:]}")

    # -- checks ---------------------------------------------------------------------------
    def _check(self, ep: Episode) -> None:
        from rayorch.runtime.sinks import read_outputs

        written: list[dict[str, Any]] = []
        if ep.out_dir.exists():
            try:
                written = list(read_outputs(ep.out_dir))
            except Exception as exc:
                ep.problems.append(f"read_outputs refused {ep.out_dir}: {exc}")
        counts = Counter(i for i, _ in ep.printed) + Counter(r["index"] for r in written)
        ep.lost = sorted(set(range(self.items)) - set(counts))
        ep.redelivered = sorted(i for i, c in counts.items() if c > 1)
        ep.excess = sum(c - 2 for c in counts.values() if c > 2) + max(
            0, len(ep.redelivered) - (1 if ep.interrupted else 0))
        expected = reference(self.items, ep.slow_first)
        for index, value in ep.printed:
            if value != expected.get(index):
                ep.wrong.append(index)
        for record in written:
            index = record["index"]
            if record.get("outcome") != "present" or record.get("value") != expected.get(index):
                ep.wrong.append(index)
        self.log(f"caller {ep.run_id}: printed {len(ep.printed)}, resumes wrote {len(written)} "
                 f"({ep.resumes} resume(s), {ep.resume_kills} killed); lost {ep.lost}, "
                 f"re-delivered {ep.redelivered}, excess {ep.excess}"
                 + (f"; PROBLEMS {ep.problems}" if ep.problems else ""))

    def audit(self, ep: Episode) -> list[str]:
        """``rayorch audit RUN --out-dir D`` (store invariants and file-sink evidence), plus
        one ``OutputEmitted`` per source in the store."""
        from rayorch.core.facts import OutputEmitted
        from rayorch.store import open_store

        found = cli_audit(self.direct_url, ep.run_id, ep.out_dir)
        store = open_store(self.direct_url)
        try:
            emitted = Counter(s.fact.index for facts in store.read_run(ep.run_id, payloads=False)
                              .values() for s in facts if isinstance(s.fact, OutputEmitted))
        finally:
            store.close()
        if sorted(emitted) != list(range(self.items)) or set(emitted.values()) != {1}:
            found.append(f"{ep.run_id}: OutputEmitted per source {dict(sorted(emitted.items()))}")
        return found


def cli_audit(url: str, run_id: str, out_dir: Path | None) -> list[str]:
    """``rayorch audit RUN --store URL [--out-dir D]``: its findings ([] when it says OK)."""
    from rayorch.cli import main as cli_main

    captured = io.StringIO()
    args = ["audit", run_id, "--store", url] + ([] if out_dir is None else
                                                ["--out-dir", str(out_dir)])
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        code = cli_main(args)
    if code == 0:
        return []
    lines = [line.strip() for line in captured.getvalue().splitlines()
             if "VIOLATION" in line or "FAILED" in line or "rayorch:" in line]
    return [f"audit {run_id} (exit {code}): " + " | ".join(lines)[:1500]]


class ReplyDropper:
    """Loses a reply to a commit or a fenced append every ``interval`` s (alternating)."""

    def __init__(self, proxy: Any, interval: float, seed: int) -> None:
        from rayorch.store.scripts import APPEND_FENCED, COMMIT_BATCH

        self.proxy = proxy
        self.interval = interval
        self.rng = random.Random(seed * 31 + 7)
        self.kinds = {COMMIT_BATCH.sha.encode(): "commit", APPEND_FENCED.sha.encode(): "append"}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reply-dropper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        shas = list(self.kinds)
        n = 0
        while not self.stop.is_set():
            self.proxy.drop_next_reply(shas[n % len(shas)])
            n += 1
            deadline = time.monotonic() + 10 * self.interval
            while self.proxy.armed and time.monotonic() < deadline and not self.stop.is_set():
                time.sleep(0.05)
            self.stop.wait(self.interval * self.rng.uniform(0.5, 1.5))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.proxy.drop_next_reply(b"\x00never\x00")  # disarm: no request carries this
        self.proxy.close()

    def counts(self) -> dict[str, int]:
        return {f"{self.kinds.get(m, m.decode(errors='replace'))} reply lost": n
                for m, n in self.proxy.dropped_by_match.items()}


def _printed(path: Path) -> list[tuple[int, Any]]:
    from bench.caller_run import parse_line

    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")[:-1]  # a last line without its newline is not printed yet
    # Ray's own warnings (a raylet's "worker processes have been started") reach the
    # caller's stdout too; only "<index>\t<value>" lines are what it printed.
    return [parse_line(line) for line in lines if re.match(r"\d+(\t|$)", line)]


def _tail(path: Path) -> str:
    from rayorch.core.sanitize import sanitize

    text = path.read_text(errors="replace").strip() if path.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return sanitize(" / ".join(lines[-2:]))[:400]
