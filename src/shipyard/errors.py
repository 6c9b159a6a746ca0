"""The one error tree of Shipyard.

Every error a user can meet carries a stable ``code``, a message with the numbers and a ``hint``
that says what to do. Boundaries translate: the CLI prints ``Error:``/``Hint:`` and exits 1.

    ShipyardError
    ├── InvalidSpec            a job spec or a command's input is malformed or inconsistent
    │   └── DatasetError       a dataset path is missing, empty or unreadable
    ├── NotFound               a job, model or file that was named does not exist
    ├── Unauthenticated        no valid credentials: wrong password, bad/expired/revoked token
    ├── Throttled              too many failed attempts: try again after ``retry_after_s``
    │   └── Overloaded         the server is busy with others' work: try again after ``retry_after_s``
    ├── Forbidden              authenticated, but the role does not allow the action
    ├── Conflict               the resource is in a state that forbids the request
    ├── PayloadTooLarge        an upload is larger than the server accepts
    ├── Unschedulable          no device set of this machine can ever run the job
    ├── ExecutorError          a job could not be launched or controlled
    │   └── LaunchFailed       an attempt did not start; ``transient`` says whether to try again
    ├── CheckpointError        a checkpoint could not be written or read
    ├── AuditChainBroken       a record of the audit log was modified, deleted, inserted or moved
    ├── StorageError           the artifact store could not write or reach a root or endpoint
    │   └── CorruptData        stored bytes fail their checksum or authentication tag (or a wrong key)
    └── DependencyMissing      an optional extra (torch, ...) is not installed
"""

from __future__ import annotations

__all__ = [
    "AuditChainBroken",
    "CheckpointError",
    "Conflict",
    "CorruptData",
    "DatasetError",
    "DependencyMissing",
    "ExecutorError",
    "Forbidden",
    "InvalidSpec",
    "LaunchFailed",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "ShipyardError",
    "StorageError",
    "Throttled",
    "Unauthenticated",
    "Unschedulable",
]


class ShipyardError(Exception):
    """Base of every error Shipyard raises on purpose."""

    code: str = "shipyard_error"
    http_status: int = 500

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InvalidSpec(ShipyardError):
    """Raised when a job spec or other input is malformed; the message names the field."""

    code = "invalid_spec"
    http_status = 422


class DatasetError(InvalidSpec):
    """Raised when a dataset path does not exist, matches no file, or holds no text."""

    code = "dataset_error"


class NotFound(ShipyardError):
    """Raised when a named job, model version or file does not exist."""

    code = "not_found"
    http_status = 404


class Conflict(ShipyardError):
    """Raised when the resource's state forbids the request (cancel a finished job, ...)."""

    code = "conflict"
    http_status = 409


class Unschedulable(ShipyardError):
    """Raised at submit time when no accelerator set of this machine could ever run the job."""

    code = "unschedulable"
    http_status = 422


class ExecutorError(ShipyardError):
    """Raised when a job could not be launched, signalled or observed."""

    code = "executor_error"


class LaunchFailed(ExecutorError):
    """Raised when an engine did not start an attempt. ``transient`` when a later try may
    succeed (nodes not reserved in time, a node lost meanwhile): the job waits and is tried
    again; otherwise the job fails with the message."""

    code = "launch_failed"

    def __init__(self, message: str, *, transient: bool, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.transient = transient


class CheckpointError(ShipyardError):
    """Raised when a checkpoint cannot be written or read back."""

    code = "checkpoint_error"


class DependencyMissing(ShipyardError):
    """Raised when a feature needs an optional extra that is not installed."""

    code = "dependency_missing"


class AuditChainBroken(ShipyardError):
    """Raised by ``audit verify`` when the chain does not hold; the message names the record."""

    code = "audit_chain_broken"


class Unauthenticated(ShipyardError):
    """Raised when credentials are missing or invalid; never says which part was wrong."""

    code = "unauthenticated"
    http_status = 401


class Throttled(ShipyardError):
    """Raised while a client is made to wait after failed attempts; says for how long."""

    code = "throttled"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: float, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after_s = retry_after_s


class Overloaded(Throttled):
    """Raised when a bounded resource of the server (password hashing, uploads, streams) is
    taken: no one caller's flood takes the service from the others."""

    code = "overloaded"
    http_status = 503


class Forbidden(ShipyardError):
    """Raised when the caller's roles do not grant the permission; the message names both."""

    code = "forbidden"
    http_status = 403


class StorageError(ShipyardError):
    """Raised when the artifact store cannot write or reach a root or an S3 endpoint."""

    code = "storage_error"
    http_status = 507


class CorruptData(StorageError):
    """Raised when stored bytes fail their checksum or tag: never returns wrong bytes. (Not
    named IntegrityError, which is SQLAlchemy's for a violated constraint; the code stays.)"""

    code = "integrity_error"
    http_status = 500


class PayloadTooLarge(ShipyardError):
    """Raised when an upload exceeds the configured limit; the message names the limit."""

    code = "payload_too_large"
    http_status = 413
