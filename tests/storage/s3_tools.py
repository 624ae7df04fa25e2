"""Tools of the object-store tests: a bucket's keys by boto3 (independent of rayorch)."""

from __future__ import annotations


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key in ``bucket`` under ``prefix`` (boto3, independent of rayorch)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    found: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [obj["Key"] for obj in page.get("Contents", [])]
    return found
