"""A real S3 server for tests: moto's, on a free loopback port, and the AWS variables that point at it."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

REGION = "us-east-1"
TEST_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@contextlib.contextmanager
def moto_s3_server() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the block; yields its endpoint URL (``http://127.0.0.1:PORT``)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the server at ``endpoint``, to arrange and inspect buckets."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` unless it is there already."""
    client = s3_client(endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        client.create_bucket(Bucket=bucket)


def object_keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix`` in ``bucket``, sorted."""
    paginator = s3_client(endpoint).get_paginator("list_objects_v2")
    return sorted(item["Key"] for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
                  for item in page.get("Contents", []))


def aws_variables(endpoint: str) -> dict[str, str]:
    """The AWS variables a user sets to reach the server at ``endpoint``."""
    return {"AWS_ENDPOINT_URL": endpoint, **TEST_KEYS, "AWS_REGION": REGION}


def closed_port_endpoint() -> str:
    """An endpoint URL on a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"
