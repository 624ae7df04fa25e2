"""``rayorch audit`` and ``rayorch show`` on finished and tampered runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from rayorch.cli import EXIT_INVARIANT, EXIT_OK, main
from rayorch.core.facts import REPORT_PRESENT, GrainCommitted
from rayorch.inspect.audit import audit_run
from rayorch.store import open_store
from rayorch.store.keys import ShardKeys
from rayorch.store.records import encode_fact
from rayorch.store.scripted_run import write_scripted_run

pytestmark = pytest.mark.integration


def forge(url: str, run: str, shard: int, fact: GrainCommitted) -> None:
    """Write a fact behind the commit gate's back, as a tampering hand would."""
    client = redis.Redis.from_url(url)
    keys = ShardKeys(run, shard)
    seq = client.incr(keys.seq)
    client.xadd(keys.facts("root/0"), {"f": encode_fact(fact)}, id=f"{seq}-0")


def test_audit_passes_on_a_finished_run(redis_url: str, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    write_scripted_run(open_store(redis_url), "done")
    assert main(["audit", "done", "--store", redis_url]) == EXIT_OK
    out = capsys.readouterr().out
    assert "run done: OK" in out
    assert "outputs: present 2, suppressed 2" in out
    assert "grains: dispatched 16, group_failure 1, present 9, record_failure 1, retried 1" in out
    assert main(["audit", "done", "--store", redis_url, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["violations"] == []
    assert report["counts"]["expansions"] == {"succeeded": 4}


@pytest.mark.parametrize(
    ("forged", "message"),
    [
        (GrainCommitted("ocr", (3, 1), 0, REPORT_PRESENT, ("x",)), "after a GroupFailure barrier"),
        (GrainCommitted("ocr", (2, 3), 0, REPORT_PRESENT, ("x",)), "not in flight"),
        (GrainCommitted("ocr", (2, 3), 0, REPORT_PRESENT, ("x",)), "ordinal 3 outside 0..0"),
    ],
)
def test_audit_fails_on_a_tampered_stream_naming_the_object(
    redis_url: str, capsys: pytest.CaptureFixture[str], forged: GrainCommitted, message: str
) -> None:
    write_scripted_run(open_store(redis_url), "tampered", pages=(3, 1, 1, 5))
    forge(redis_url, "tampered", 1, forged)
    assert main(["audit", "tampered", "--store", redis_url]) == EXIT_INVARIANT
    out = capsys.readouterr().out
    name = f"ocr[{forged.path[0]}.{forged.path[1]}]"
    assert "FAILED" in out
    assert any(name in line and message in line for line in out.splitlines()), out


def test_audit_names_a_grain_sealed_twice(redis_url: str, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    write_scripted_run(open_store(redis_url), "twice")
    forge(redis_url, "twice", 0, GrainCommitted("ocr", (0, 0), 0, REPORT_PRESENT, ("again",)))
    assert main(["audit", "twice", "--store", redis_url, "--json"]) == EXIT_INVARIANT
    report = json.loads(capsys.readouterr().out)
    objects = {v["object"] for v in report["violations"]}
    assert "ocr[0.0]" in objects
    assert any("sealed twice" in v["message"] for v in report["violations"])


def test_show_prints_the_lineage_tree(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_scripted_run(open_store(redis_url), "tree")
    assert main(["show", "tree", "3", "--store", redis_url]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "source 3: admitted with ['doc3.pdf']"
    assert "  expansion root/0: succeeded, 5 children" in out
    assert any(line.strip().startswith("ocr[3.0]: dispatched as attempt 0; attempt 0 lost "
                                       "(worker crashed)") for line in out)
    assert "    ocr[3.2]: dispatched as attempt 0; committed attempt 0: group failure " \
           "(corrupt document)" in out
    assert any("ocr[3.1]" in line and "suppressed by a GroupFailure" in line for line in out)
    assert out[-1] == "output of source 3: suppressed"
    assert main(["show", "tree", "0.1", "--store", redis_url, "--json"]) == EXIT_OK
    facts = json.loads(capsys.readouterr().out)
    assert [f["type"] for f in facts] == ["grain_dispatched", "grain_committed"]


def test_console_script_exit_codes_and_plain_errors(redis_url: str) -> None:
    write_scripted_run(open_store(redis_url), "cli")
    env = {**os.environ, "RAYORCH_STORE": redis_url}
    ok = subprocess.run([sys.executable, "-m", "rayorch.cli", "audit", "cli"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == EXIT_OK, ok.stderr
    missing = subprocess.run([sys.executable, "-m", "rayorch.cli", "show", "nope", "1"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert "run 'nope' not found" in missing.stderr


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_audit_reports_a_committed_payload_that_does_not_resolve(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    payload_dir = tmp_path / "payloads"
    url = f"{redis_url}?payload_dir={payload_dir}&payload_threshold=40&keep=all"
    store = open_store(url)
    write_scripted_run(store, "lost")
    refs = sorted(f.payload_ref for k in range(store.run_info("lost").shards)
                  for f in (s.fact for s in store.read("lost", k, payloads=False))
                  if isinstance(f, GrainCommitted) and f.payload_ref)
    assert refs, "the scripted run's outputs should be over the payload threshold"
    ref = refs[0]
    segment, _, span = ref.partition("@")
    victim = payload_dir / segment
    if damage == "missing":
        victim.unlink()
        lost = [r for r in refs if r.startswith(segment + "@")]  # every value in it
    else:
        offset, _, length = span.partition("+")
        data = bytearray(victim.read_bytes())
        data[int(offset) + int(length) - 1] ^= 0xFF  # one value's last byte
        victim.write_bytes(bytes(data))
        lost = [ref]
    assert main(["audit", "lost", "--store", url]) == EXIT_INVARIANT
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if ref in line]
    assert line.startswith("  VIOLATION ") and "run lost " in line
    assert "does not resolve" in line and "Traceback" not in out
    # the other payloads and every other check still ran: one finding per lost value
    assert sum("VIOLATION" in line for line in out.splitlines()) == len(lost)


def test_audit_accepts_values_freed_after_delivery_and_refuses_a_kept_one_gone(
        redis_url: str, tmp_path: Path) -> None:
    """By default a delivered source's intermediate values are freed: the audit counts them
    and is clean; a delivered Call's value gone is a violation naming it."""
    payload_dir = tmp_path / "payloads"
    store = open_store(f"{redis_url}?payload_dir={payload_dir}&payload_threshold=8")
    write_scripted_run(store, "freed")
    report = audit_run(store, "freed")
    assert report.ok, report
    assert report.counts["payloads"]["freed"] > 0
    left = sorted(payload_dir.rglob("*.seg"))
    assert left and {p.parent.name for p in left} == {"assemble"}  # the delivered Call's
    left[0].unlink()
    report = audit_run(store, "freed")
    assert [v.message for v in report.violations if "its value is delivered" in v.message]
