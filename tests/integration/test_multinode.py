"""A multi-node Ray cluster (``ray.cluster_utils.Cluster``) over a Redis Cluster store.

The driver runs on the head node; the OCR pool is pinned by ``resources=`` to two worker
nodes, one replica on each; mid-run one worker node is removed. Its actor is replaced on
the surviving node, and the run completes with every output right, once, and audited.

The scenario needs a Ray of its own, so the test runs this file as a script in a
subprocess (the session's local Ray stays untouched) and reads its JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch import F

REPO = Path(__file__).resolve().parents[2]


class SplitDoc:
    def __call__(self, docs: list[str]) -> list[list[str]]:
        return [[f"{d}/p{i}" for i in range(1 + len(d) % 5)] for d in docs]


class Ocr:
    """Sleeps like a GPU batch; says which node and which actor did the work."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, pages: list[str]) -> list[dict[str, str]]:
        import time

        import ray

        time.sleep(self.ms / 1000)
        context = ray.get_runtime_context()
        node, actor = context.get_node_id(), context.get_actor_id() or ""
        return [{"text": p.upper(), "node": node, "actor": actor} for p in pages]


class Assemble:
    def __call__(self, docs: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
        return [{"text": " ".join(p["text"] for p in pages),
                 "workers": sorted({(p["node"], p["actor"]) for p in pages})} for pages in docs]


class NodesPipeline(ro.Pipeline):
    """split and assemble on the head node ("head"), OCR on the worker nodes ("work")."""

    # 400 ms a batch: after the node goes, the work left outlasts the start of the actor
    # that replaces its actor on the survivor (batches go only to actors that are up).
    def __init__(self, ms: float = 400.0) -> None:
        super().__init__()
        on_head = {"num_cpus": 0.1, "resources": {"head": 0.1}}
        self.split = ro.RayModule(SplitDoc, batch_size=4, **on_head)
        self.ocr = ro.RayModule(Ocr, ms=ms, replicas=2, batch_size=4, num_cpus=0.1,
                                resources={"work": 1}, max_attempts=5)
        self.assemble = ro.RayModule(Assemble, batch_size=4, **on_head)

    def forward(self, docs: Any) -> Any:
        return self.assemble(F.reduce(self.ocr(F.expand(self.split(docs)))))


def scenario(workdir: Path, docs: int) -> dict[str, Any]:
    """Run the scenario; return what the test checks."""
    import ray
    from ray.cluster_utils import Cluster

    from rayorch.inspect.audit import audit_run
    from rayorch.store import open_store
    from rayorch.testing import RedisClusterNodes

    redis = RedisClusterNodes(workdir / "redis")
    redis.start()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"head": 1}, "include_dashboard": False})
    try:
        survivor = cluster.add_node(num_cpus=1, resources={"work": 2})
        ray.init(address=cluster.address, log_to_driver=False)
        # Another job's actor fills one "work" slot of the survivor, so the pool's two
        # replicas can only go one per worker node; it ends before the other node goes.
        blocker = ray.remote(num_cpus=0, resources={"work": 1})(_Blocker).remote()
        ray.get(blocker.ping.remote())
        doomed = cluster.add_node(num_cpus=1, resources={"work": 1})
        cluster.wait_for_nodes()
        inputs = [f"doc{i}" + "x" * (i % 7) for i in range(docs)]
        handle = NodesPipeline().run(inputs, store=redis.url, shards=3, micro_batch=2,
                                     max_active_sources=6, progress=False, quiet=True)
        results: dict[int, Any] = {}
        removed_after = None
        for index, value in handle:
            results[index] = value  # in emission order
            if removed_after is None and len(results) == docs // 3:
                ray.kill(blocker)
                cluster.remove_node(doomed)
                removed_after = len(results)
        audit = audit_run(open_store(redis.url), handle.run_id)
        return {
            "results": [[k, v] for k, v in results.items()],
            "inputs": inputs,
            "removed_after": removed_after,
            "survivor": survivor.node_id,
            "doomed": doomed.node_id,
            "audit_ok": audit.ok,
            "audit": [str(v) for v in audit.violations][:5],
        }
    finally:
        ray.shutdown()
        cluster.shutdown()
        redis.stop()


class _Blocker:
    def ping(self) -> int:
        return 1


@pytest.mark.long
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_worker_node_removed_mid_run_actors_move_and_nothing_is_lost(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, __file__, str(tmp_path), "24", str(report_file)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert report_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_file.read_text())
    inputs: list[str] = report["inputs"]
    emitted = report["results"]  # [index, value] in emission order
    pages = SplitDoc()(inputs)
    assert sorted(i for i, _ in emitted) == list(range(len(inputs))), "each output once"
    for index, value in emitted:
        assert value["text"] == " ".join(p.upper() for p in pages[index]), index
    cut = report["removed_after"]
    assert cut is not None and cut < len(inputs), "the node must go mid-run"
    workers = {tuple(w) for _, value in emitted for w in value["workers"]}
    before = {node for _, value in emitted[:cut] for node, _ in value["workers"]}
    assert {report["survivor"], report["doomed"]} <= before, "OCR ran on both worker nodes"
    on_survivor = {actor for node, actor in workers if node == report["survivor"]}
    assert len(on_survivor) == 2, "the doomed node's actor was replaced on the survivor"
    assert {node for node, _ in workers} == {report["survivor"], report["doomed"]}
    assert report["audit_ok"], report["audit"]


if __name__ == "__main__":
    workdir, count, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    out.write_text(json.dumps(scenario(workdir, count)))
