"""The cluster backend: an S3-compatible object store (SeaweedFS, MinIO, Ceph RGW) through boto3.

The object store keeps its own replicas (SeaweedFS replication ``010`` puts them in two racks), so
one object is written per blob. Objects are streamed with multipart uploads, every read is
verified by the store above against the blob's digest or authentication tags, and requests are
retried with exponential backoff (botocore's standard mode), reads once more from the start.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from shipyard.errors import CorruptData, DependencyMissing, StorageError
from shipyard.storage.backend import Replica, ScrubTally, Verify, Written
from shipyard.storage.config import S3Config

PART_BYTES = 16 << 20
READ_ATTEMPTS = 4


class S3Objects:
    kind = "s3"

    def __init__(self, config: S3Config) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise DependencyMissing(
                "the S3 backend needs boto3", hint="pip install 'shipyard[s3]' (or boto3)"
            ) from exc
        self.config = config
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=config.endpoint_url,
            aws_access_key_id=config.access_key,
            aws_secret_access_key=config.secret_key,
            region_name=config.region,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": config.max_attempts, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                # SeaweedFS and older MinIO reject the CRC trailers newer boto3 adds by default.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self._bucket_checked = False

    @property
    def label(self) -> str:
        return f"{self.config.endpoint_url}/{self.config.bucket}"

    def _key(self, name: str) -> str:
        return self.config.prefix + name

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StorageError(
                f"S3 {self.label}: {what} failed: {error.get('Code')} {error.get('Message', '')}".strip(),
                hint="check the bucket and credentials in the s3 section of storage.yaml",
            ) from exc
        except BotoCoreError as exc:
            raise StorageError(
                f"S3 endpoint {self.config.endpoint_url} unreachable during {what}: {exc}",
                hint="check s3.endpoint_url in storage.yaml and that the object store is running",
            ) from exc

    def _ensure_bucket(self) -> None:
        if self._bucket_checked:
            return
        from botocore.exceptions import ClientError

        try:
            self._call("checking the bucket", self.client.head_bucket, Bucket=self.config.bucket)
        except StorageError as exc:
            if not isinstance(exc.__cause__, ClientError):
                raise
            try:
                self._call("creating the bucket", self.client.create_bucket, Bucket=self.config.bucket)
            except StorageError as exc:  # another node created it at the same moment
                code = (
                    exc.__cause__.response["Error"].get("Code")
                    if isinstance(exc.__cause__, ClientError)
                    else None
                )
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
        self._bucket_checked = True

    # -- writing ----------------------------------------------------------------------------------

    def write(self, chunks: Iterable[bytes], name_of: Callable[[], str], replicas: int) -> Written:
        del replicas  # the object store replicates by its own policy
        self._ensure_bucket()
        name = name_of()  # the store names S3 objects up front (see ArtifactStore)
        key, bucket = self._key(name), self.config.bucket
        parts = _parts(chunks, PART_BYTES)
        first = next(parts, b"")
        second = next(parts, None)
        if second is None:
            self._call(f"writing {name}", self.client.put_object, Bucket=bucket, Key=key, Body=first)
            return Written(name, [self.label])
        upload = self._call(f"starting {name}", self.client.create_multipart_upload, Bucket=bucket, Key=key)
        upload_id = upload["UploadId"]
        done: list[dict[str, Any]] = []
        try:
            for number, part in enumerate(_chain(first, second, parts), start=1):
                reply = self._call(
                    f"writing part {number} of {name}",
                    self.client.upload_part,
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                )
                done.append({"PartNumber": number, "ETag": reply["ETag"]})
            self._call(
                f"completing {name}",
                self.client.complete_multipart_upload,
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise
        return Written(name, [self.label])

    def ensure(self, name: str, replicas: int) -> None:
        """The object store keeps its own replica count."""

    # -- reading ----------------------------------------------------------------------------------

    def replicas(self, name: str) -> list[Replica]:
        if not self._exists(name):
            return []
        # One object, read again from the start after a failure (a volume server going away).
        return [
            Replica(f"{self.label} (attempt {n + 1})", self._opener(name, n)) for n in range(READ_ATTEMPTS)
        ]

    def _exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        self._ensure_bucket()
        try:
            self._call(
                f"looking up {name}", self.client.head_object, Bucket=self.config.bucket, Key=self._key(name)
            )
        except StorageError as exc:
            if isinstance(exc.__cause__, ClientError):
                return False
            raise
        return True

    def _opener(self, name: str, attempt: int) -> Callable[[], contextlib.AbstractContextManager[BinaryIO]]:
        @contextlib.contextmanager
        def open_object() -> Iterator[BinaryIO]:
            if attempt:
                time.sleep(0.25 * 2**attempt)
            reply = self._call(
                f"reading {name}", self.client.get_object, Bucket=self.config.bucket, Key=self._key(name)
            )
            body = reply["Body"]
            try:
                yield body
            finally:
                body.close()

        return open_object

    def remove(self, name: str) -> None:
        self._call(
            f"deleting {name}", self.client.delete_object, Bucket=self.config.bucket, Key=self._key(name)
        )

    def remove_stale(self, name: str, older_than: float) -> bool:
        head = self._call(
            f"looking up {name}", self.client.head_object, Bucket=self.config.bucket, Key=self._key(name)
        )
        if head["LastModified"].timestamp() >= older_than:
            return False
        self.remove(name)
        return True

    def objects(self) -> Iterator[tuple[str, float]]:
        self._ensure_bucket()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=self.config.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"][len(self.config.prefix) :], item["LastModified"].timestamp()

    def scrub(
        self,
        name: str,
        replicas: int,
        verify: Verify | None,
        repair: bool,
        source_check: Verify | None = None,
    ) -> ScrubTally:
        """Reads the object and checks it; lost copies inside the object store are its own to
        repair (SeaweedFS: ``volume.fix.replication``)."""
        del replicas, repair, source_check  # the object store's replication policy governs them
        tally = ScrubTally(checked=1)
        copies = self.replicas(name)
        if not copies:
            tally.missing, tally.lost, tally.lost_names = 1, 1, [name]
            return tally
        if verify is None:
            return tally
        for copy in copies:
            try:
                with copy.open() as body:
                    counted = _Counting(body)
                    verify(counted.read)
                tally.bytes_verified += counted.bytes
                return tally
            except CorruptData:
                tally.corrupt += 1
            except StorageError:
                continue
        tally.lost, tally.lost_names = 1, [name]
        return tally

    def describe(self) -> list[dict[str, object]]:
        try:
            self._ensure_bucket()
            reachable = True
        except StorageError:
            reachable = False
        return [{"endpoint": self.config.endpoint_url, "bucket": self.config.bucket, "reachable": reachable}]


class _Counting:
    def __init__(self, body: BinaryIO) -> None:
        self.body, self.bytes = body, 0

    def read(self, size: int) -> bytes:
        data = self.body.read(size)
        self.bytes += len(data)
        return data


def _parts(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        if len(buffer) >= size:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


def _chain(first: bytes, second: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield second
    yield from rest
