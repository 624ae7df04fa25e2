"""Tools of the object-store tests: a bucket's keys by boto3 (independent of rayorch), and
Azurite's account."""

from __future__ import annotations

import os

# Azurite's well-known development account (public, in Microsoft's documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


def azure_connection() -> str:
    """The connection string of the session's Azurite (for Microsoft's SDK)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={os.environ['AZURE_STORAGE_ENDPOINT']};")


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key in ``bucket`` under ``prefix`` (boto3, independent of rayorch)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    found: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [obj["Key"] for obj in page.get("Contents", [])]
    return found
