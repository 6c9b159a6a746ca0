"""Queues and quotas as a document, in Kueue's words (``queues.yaml``, or applied through the API):

    clusterQueues:
      - {name: research, cohort: lab, nominal: {cpu: 2, h100-sxm: 8}, borrowingLimit: {h100-sxm: 4}}
      - {name: prod, cohort: lab, nominal: {h100-sxm: 8}}
    localQueues: {team-a: research, serving: prod}

A ClusterQueue owns a nominal quota of devices per accelerator type (CPU quotas count cores);
LocalQueues are the names jobs give in ``queue:``. With no ``default`` local queue, the first
ClusterQueue takes jobs that name none.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from shipyard.schemas.documents import PATTERN_WORDS, load_mapping, validate_document

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
PATTERN_WORDS[QUEUE_NAME_PATTERN] = "1-64 letters, digits, '.', '_' and '-', starting with a letter or digit"
QueueName = Annotated[str, Field(pattern=QUEUE_NAME_PATTERN)]
Devices = Annotated[int, Field(ge=0, le=1_000_000)]
Placement = Literal["topology", "pack"]
"""The scheduling framework's placers (``scheduling.framework.PLACERS``, held equal by a test)."""
HINT = "write clusterQueues: [{name: ..., nominal: {cpu: 2}}] and localQueues: {team: name}"


class ClusterQueueSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: QueueName
    nominal: dict[QueueName, Devices] = Field(default_factory=dict)
    """Devices per accelerator type the queue is guaranteed."""
    cohort: QueueName | None = None
    """Queues of one cohort lend each other what they leave idle."""
    borrowing_limit: dict[QueueName, Devices] | None = Field(default=None, alias="borrowingLimit")
    """Most devices per type it may borrow from its cohort; absent: no limit."""
    placement: Placement | None = None
    """How its gangs are placed: ``topology`` (the fewest racks) or ``pack`` (the fewest nodes,
    racks unseen); absent: the cluster's (``SHIPYARD_PLACEMENT``)."""


class QueueConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cluster_queues: list[ClusterQueueSpec] = Field(alias="clusterQueues", max_length=1000)
    local_queues: dict[QueueName, QueueName] = Field(default_factory=dict, alias="localQueues")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [q.name for q in self.cluster_queues]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"cluster queue names must be unique; repeated: {', '.join(repeated)}")
        unknown = {k: v for k, v in self.local_queues.items() if v not in names}
        if unknown:
            pairs = ", ".join(f"{k} -> {v}" for k, v in sorted(unknown.items()))
            raise ValueError(
                f"local queues point at unknown cluster queues ({pairs}); cluster queues: "
                + (", ".join(names) or "none")
            )
        return self

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.document(), sort_keys=False)

    def with_queue(self, queue: ClusterQueueSpec) -> QueueConfig:
        """This configuration with ``queue`` added, or replacing the one of its name."""
        others = [q for q in self.cluster_queues if q.name != queue.name]
        position = next((i for i, q in enumerate(self.cluster_queues) if q.name == queue.name), len(others))
        others.insert(position, queue)
        return self.model_copy(update={"cluster_queues": others})

    def without_queue(self, name: str) -> QueueConfig:
        """This configuration without the cluster queue ``name`` and the local queues naming it."""
        return validate_queue_config(
            {
                "clusterQueues": [q.model_dump(by_alias=True, exclude_none=True)
                                  for q in self.cluster_queues if q.name != name],
                "localQueues": {k: v for k, v in self.local_queues.items() if v != name},
            },
            source="queue configuration",
        )  # fmt: skip


def parse_queue_config(text: str, *, source: str) -> QueueConfig:
    document = load_mapping(text, source=source, expected="a YAML mapping with `clusterQueues`", hint=HINT)
    return validate_queue_config(document, source=source)


def validate_queue_config(document: Any, *, source: str = "queue configuration") -> QueueConfig:
    return validate_document(QueueConfig, document, source=source, hint=HINT)
