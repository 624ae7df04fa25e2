"""``Pipeline.run`` starts the same Ray the jobs do: sized for its pools on this machine.

The script below runs as a user's would (its own process, no Ray running), so the Ray that
``Pipeline.run`` starts is the one it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.runtime.ray_cluster import gpu_count
from rayorch.testing_cli import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = '''
import json, os
import ray
import rayorch as ro


class Echo:
    def __call__(self, xs):
        return list(xs)


class OnAGpu(ro.Pipeline):
    def __init__(self):
        super().__init__()
        self.cpu = ro.RayModule(Echo, replicas=1, num_cpus=0.5)
        self.gpu = ro.RayModule(Echo, replicas="auto", num_gpus=1, num_cpus=0.5)

    def forward(self, xs):
        return self.gpu(self.cpu(xs))


if __name__ == "__main__":
    outputs = OnAGpu().run([1, 2, 3], progress=False, quiet=True).outputs
    have = ray.cluster_resources()
    print(json.dumps({"outputs": outputs, "CPU": have.get("CPU", 0.0),
                      "GPU": have.get("GPU", 0.0)}))
'''


def test_pipeline_run_declares_the_machines_gpus_for_a_pool_that_sizes_itself(
        tmp_path: Path) -> None:
    """A GPU pool that sizes itself grows into the machine's GPUs, so ``Pipeline.run``'s
    local Ray declares them all (at least the one its first actor needs: on a machine
    without GPUs it would otherwise not start) and the machine's cores, as the jobs'
    Ray does; a Ray that Ray sized itself would cap the pool, or refuse it here."""
    script = tmp_path / "on_a_gpu.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["outputs"] == [1, 2, 3]
    assert report["GPU"] == max(1, gpu_count())
    assert report["CPU"] == os.cpu_count()
