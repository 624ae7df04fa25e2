"""A second cloud: the same sink, payloads and PDF job on ``az://`` against Azurite,
Microsoft's Azure Storage emulator (conftest.py): the storage layer is not S3-shaped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.core.facts import GrainCommitted
from rayorch.runtime.sink_audit import check_delivery
from rayorch.runtime.sinks import FileSink, read_outputs
from rayorch.storage import open_storage
from rayorch.store.payload import PayloadStore, object_of

pytestmark = [pytest.mark.azure, pytest.mark.timeout(600)]

pytest.importorskip("obstore")
pytest.importorskip("azure.storage.blob")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"


def test_conditional_create_claims_and_listing_on_azure(container: str) -> None:
    url = f"az://{container}/out"
    storage = open_storage(f"az://{container}/raw")
    assert storage.create("a.bin", b"one") and not storage.create("a.bin", b"two")
    assert storage.read("a.bin") == b"one"  # If-None-Match: *, never replaced
    writer = FileSink(url, run_id="r")
    written = writer.write_part(0, [(0, "a"), (1, "b")])
    refused = writer.write_part(0, [(2, "c")])
    heir = FileSink(url, run_id="r")
    adopted = heir.adopt(0, [0, 1])
    writer.discard(written)  # adopted first: it stays
    writer.discard(refused)  # nobody adopted it: it goes
    assert sorted(r["index"] for r in read_outputs(url)) == [0, 1]
    assert check_delivery(url, adopted, complete=True) == []
    with pytest.raises(Exception, match="outputs of run 'r', not 'other'"):
        FileSink(url, run_id="other")


def test_payloads_on_azure_round_trip_and_are_listed(container: str) -> None:
    payloads = PayloadStore(f"az://{container}/payloads", owner="redis://h:1/0")
    report = GrainCommitted(call="ocr", path=(0, 1), generation=2, outcome="present",
                            outputs=("x" * 100,))
    [sealed], [ref] = payloads.write_segment("run-1", [report])
    _, [same] = payloads.write_segment("run-1", [report])  # a retry: the same object
    assert ref == same and sealed.outputs is None
    assert payloads.load(ref) == ("x" * 100,)
    assert payloads.refs("run-1") == {object_of(ref)}
    assert payloads.owner_of("run-1") == "redis://h:1/0"
    payloads.delete_run("run-1")
    assert payloads.refs("run-1") == set()


def test_the_pdf_job_from_azure_to_azure(container: str, tmp_path: Path) -> None:
    from azure.storage.blob import ContainerClient
    from s3_tools import azure_connection

    client = ContainerClient.from_connection_string(azure_connection(), container)
    names = ["phonrule-doc.pdf", "qtree-qarrows.pdf"]
    for name in names:
        client.upload_blob(f"in/{name}", (EXAMPLES / name).read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input",
                           f"az://{container}/in", "--output", f"az://{container}/out",
                           "--json", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["succeeded"] == len(names)
    stored = sorted(b.name for b in client.list_blobs(name_starts_with="out/"))
    assert [n for n in stored if n.endswith(".md")] == \
        ["out/00000-phonrule-doc.md", "out/00001-qtree-qarrows.md"]
    assert sorted(r["index"] for r in read_outputs(f"az://{container}/out")) == [0, 1]
    assert list(tmp_path.iterdir()) == []
    shutil.rmtree(tmp_path, ignore_errors=True)
