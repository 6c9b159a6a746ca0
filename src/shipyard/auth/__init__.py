"""Who may do what, as a pure rule: roles per project, cluster admins above them, default deny.

``allows`` decides from the actor and the role it holds in the project; looking the role up, and
auditing a refusal, is the service layer's (``services/accounts/rbac.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from shipyard.domain.actor import Actor


class Permission(StrEnum):
    JOB_READ = "job.read"
    JOB_LOGS = "job.logs"
    JOB_SUBMIT = "job.submit"
    JOB_CANCEL_OWN = "job.cancel.own"
    JOB_CANCEL_ANY = "job.cancel.any"
    JOB_CHECKPOINTS = "job.checkpoints"
    """Read a job's checkpoints (its weights): resume another job from them."""
    MODEL_READ = "model.read"
    MODEL_DOWNLOAD = "model.download"
    MODEL_PUBLISH = "model.publish"
    MODEL_PROMOTE = "model.promote"
    MODEL_DELETE = "model.delete"
    DATASET_READ = "dataset.read"
    ARTIFACT_READ = "artifact.read"
    ARTIFACT_WRITE = "artifact.write"
    ARTIFACT_DELETE = "artifact.delete"
    PROJECT_ROLES = "project.roles"
    USER_MANAGE = "user.manage"
    QUEUE_MANAGE = "queue.manage"
    AUDIT_READ = "audit.read"
    STORAGE_SCRUB = "storage.scrub"
    STORAGE_GC = "storage.gc"
    STORAGE_ROOTS = "storage.roots"
    STORAGE_ROTATE_KEY = "storage.rotate_key"


P = Permission
ROLES = ("viewer", "member", "maintainer", "owner")
_VIEWER = frozenset({P.JOB_READ, P.JOB_LOGS, P.MODEL_READ, P.DATASET_READ})
_MEMBER = _VIEWER | {
    P.JOB_SUBMIT,
    P.JOB_CANCEL_OWN,
    P.JOB_CHECKPOINTS,
    P.MODEL_DOWNLOAD,
    P.ARTIFACT_READ,
    P.ARTIFACT_WRITE,
}
_MAINTAINER = _MEMBER | {P.JOB_CANCEL_ANY, P.MODEL_PUBLISH, P.MODEL_PROMOTE, P.ARTIFACT_DELETE}
_OWNER = _MAINTAINER | {P.MODEL_DELETE, P.PROJECT_ROLES}

PERMISSIONS: Mapping[str, frozenset[Permission]] = {
    "viewer": _VIEWER,
    "member": _MEMBER,
    "maintainer": _MAINTAINER,
    "owner": _OWNER,
}
"""Role -> permissions in its project. Cluster admins hold every permission everywhere, and the
cluster-wide ones (users, queues and quotas, the audit log, the store) only they hold."""

ADMIN_ONLY = frozenset(
    {
        P.USER_MANAGE,
        P.QUEUE_MANAGE,
        P.AUDIT_READ,
        P.STORAGE_SCRUB,
        P.STORAGE_GC,
        P.STORAGE_ROOTS,
        P.STORAGE_ROTATE_KEY,
    }
)


def allows(actor: Actor, permission: Permission, role: str | None, project: str | None = None) -> bool:
    """Whether ``actor``, holding ``role`` in ``project`` (None: no role, or no project), may."""
    if actor.is_admin:
        return True
    if permission in ADMIN_ONLY or project is None:
        return False
    return role is not None and permission in PERMISSIONS[role]
