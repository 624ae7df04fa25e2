"""A real S3-API server on loopback (moto's server mode) for the object-store suite.

``bash scripts/test_storage.sh`` runs these tests (marker ``s3``); ``$RAYORCH_TEST_S3``
points them at a server that is already running (CI starts one), else each session starts
its own ``moto_server`` on a free port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from s3_tools import AZURITE_ACCOUNT, AZURITE_KEY, azure_connection

from rayorch.testing import free_port

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_REGION": "us-east-1"}


def _wait_up(endpoint: str, proc: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"moto_server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"no S3 server answered at {endpoint}")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The S3 endpoint URL; ``AWS_ENDPOINT_URL`` and test credentials are set for the
    session (for rayorch in this process and the subprocesses it starts)."""
    given = os.environ.get("RAYORCH_TEST_S3")
    proc = None
    if given:
        endpoint = given
    else:
        exe = shutil.which("moto_server")
        if exe is None:
            pytest.skip("moto_server is not installed (pip install 'moto[server]')")
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        # its request log goes nowhere: a pipe nobody reads fills and blocks the server
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_up(endpoint, proc)
    try:
        with pytest.MonkeyPatch.context() as env:
            for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
                env.setenv(key, value)
            yield endpoint
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new empty bucket's name."""
    import boto3

    name = f"rayorch-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name




@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite (Microsoft's Azure Storage emulator, ``npm install -g azurite``) on a free
    port; ``AZURE_STORAGE_*`` set for the session. Yields its blob endpoint."""
    exe = shutil.which("azurite-blob")
    if exe is None:
        pytest.skip("Azurite is not installed (npm install -g azurite)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    proc = subprocess.Popen([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--location", str(tmp_path_factory.mktemp("azurite")),
                             "--skipApiVersionCheck", "--loose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    settings = {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
                "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY, "AZURE_STORAGE_ENDPOINT": endpoint}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers (400 for a bare GET)
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("Azurite did not start")
                time.sleep(0.2)
        with pytest.MonkeyPatch.context() as env:
            for key, value in settings.items():
                env.setenv(key, value)
            yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def container(azurite: str) -> str:
    """A new empty Azure container's name (made with Microsoft's own SDK)."""
    from azure.storage.blob import BlobServiceClient

    name = f"rayorch-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(azure_connection()).create_container(name)
    return name
