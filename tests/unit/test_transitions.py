"""The job state machine: which moves exist and what each sets, for every pair of states."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shipyard.domain import ExitReason, JobState
from shipyard.domain.transitions import MOVES, job_transition
from shipyard.errors import Conflict

AT = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize("before", list(JobState))
@pytest.mark.parametrize("after", list(JobState))
def test_every_pair_of_states_is_a_move_or_a_conflict(before: JobState, after: JobState) -> None:
    if after not in MOVES.get(before, frozenset()):
        with pytest.raises(Conflict, match=f"a {before} job cannot become {after}"):
            job_transition(before, after, at=AT, exit_reason=ExitReason.ERROR)
        return
    changes = job_transition(before, after, at=AT, exit_reason=ExitReason.ERROR, pending_reason="why")
    assert changes["state"] == after
    if after.is_final:  # a final state always says why and when
        assert (changes["exit_reason"], changes["finished_at"]) == (ExitReason.ERROR, AT)
        assert changes["pending_reason"] is None
    elif after == JobState.QUEUED:  # back in the queue: waiting, with its reason, not finished
        assert (changes["pending_reason"], changes["finished_at"]) == ("why", None)
    else:
        assert changes["pending_reason"] is None and "finished_at" not in changes


def test_a_final_state_without_its_reason_is_a_bug() -> None:
    with pytest.raises(ValueError, match="needs its exit reason"):
        job_transition(JobState.RUNNING, JobState.FAILED, at=AT)


def test_final_states_are_final() -> None:
    assert all(state not in MOVES for state in JobState if state.is_final)
