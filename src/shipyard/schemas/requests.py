"""The bodies the API takes, checked before any use case runs."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shipyard.schemas.queues import Devices, QueueName

USER_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MIN_PASSWORD = 12
SCOPES = ("read", "write", "admin")
DEFAULT_TOKEN_DAYS = 30.0
MAX_TOKEN_DAYS = 3650.0


class LoginRequest(BaseModel):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class NewToken(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    scopes: list[Literal["read", "write", "admin"]] | None = Field(default=None, min_length=1, max_length=3)
    days: float | None = Field(default=DEFAULT_TOKEN_DAYS, gt=0, le=MAX_TOKEN_DAYS)
    user: str | None = None
    """For another user (admins only); default: the caller."""


class NewUser(BaseModel):
    name: str = Field(pattern=USER_NAME.pattern)
    password: str | None = Field(default=None, min_length=MIN_PASSWORD, max_length=1024)
    admin: bool = False
    service: bool = False


class RoleBinding(BaseModel):
    role: Literal["viewer", "member", "maintainer", "owner"]


class Registration(BaseModel):
    job_id: str = Field(min_length=1, max_length=64)
    """A job that succeeded with an export."""


class StageChange(BaseModel):
    stage: Literal["none", "staging", "production", "archived"]


class Submission(BaseModel):
    spec: dict[str, Any]
    resume: bool = False
    resume_from: str | None = Field(default=None, max_length=4096)


class QueueUpdate(BaseModel):
    """One cluster queue's quota; its name is in the path."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    nominal: dict[QueueName, Devices] = Field(default_factory=dict)
    cohort: QueueName | None = None
    borrowing_limit: dict[QueueName, Devices] | None = Field(default=None, alias="borrowingLimit")
    local_queues: list[QueueName] = Field(default_factory=list, alias="localQueues", max_length=100)
    """Local queues (the names jobs give) to point at this queue."""
