"""Token expiry and login throttling against an injected clock (a real SQLite database, no
server): the test moves time instead of sleeping through it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from shipyard import audit
from shipyard.errors import Throttled, Unauthenticated
from shipyard.services.accounts import accounts, logins
from shipyard.services.caches.verified_tokens import VerifiedTokens
from shipyard.services.context import ServiceContext, open_context
from shipyard.settings import Settings
from tests.builders import FakeClock

PASSWORD = "a long enough passphrase"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx(tmp_path: Path, clock: FakeClock) -> Iterator[ServiceContext]:
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    context = open_context(settings, clock=clock, verified_tokens=VerifiedTokens(clock=clock))
    accounts.create_user(context, "bob", PASSWORD)
    yield context
    context.close()


def from_address(ctx: ServiceContext, address: str) -> ServiceContext:
    return ctx.acting_as(dataclasses.replace(ctx.actor, source=address))


def test_a_token_works_until_it_expires_even_while_the_server_remembers_it(
    ctx: ServiceContext, clock: FakeClock
) -> None:
    issued = accounts.issue_token(ctx, "bob", "laptop", ["read"], days=1)
    assert accounts.authenticate(ctx, issued.token, "10.0.0.1").name == "bob"
    clock.advance(24 * 3600 - 1)
    assert accounts.authenticate_cached(ctx, issued.token, "10.0.0.1") is None  # read again after its ttl
    assert accounts.authenticate(ctx, issued.token, "10.0.0.1").name == "bob"
    clock.advance(1.5)  # within the server's memory of it
    with pytest.raises(Unauthenticated, match="invalid, expired or revoked token"):
        accounts.authenticate_cached(ctx, issued.token, "10.0.0.1")  # remembered, yet expired
    with pytest.raises(Unauthenticated, match="invalid, expired or revoked token"):
        accounts.authenticate(ctx, issued.token, "10.0.0.1")


def test_failed_logins_make_the_pair_wait_and_the_wait_ends(ctx: ServiceContext, clock: FakeClock) -> None:
    guesser = from_address(ctx, "10.0.0.9")
    for _ in range(logins.FREE_FAILURES):
        with pytest.raises(Unauthenticated, match="invalid user name or password"):
            accounts.login(guesser, "bob", "not the password")
    with pytest.raises(Throttled) as waited:
        accounts.login(guesser, "bob", PASSWORD)  # even the right password waits now
    assert waited.value.retry_after_s == pytest.approx(logins.LOCK_S)
    assert accounts.login(from_address(ctx, "10.0.0.2"), "bob", PASSWORD).token  # elsewhere: no wait
    clock.advance(logins.LOCK_S - 1)
    with pytest.raises(Throttled):
        accounts.login(guesser, "bob", PASSWORD)
    clock.advance(2)
    assert accounts.login(guesser, "bob", PASSWORD).token
    # Once a right password went through, the pair starts from no failures again.
    with pytest.raises(Unauthenticated):
        accounts.login(guesser, "bob", "wrong again")
    assert accounts.login(guesser, "bob", PASSWORD).token


def test_expiry_and_revocation_are_stamped_with_the_context_clock(
    ctx: ServiceContext, clock: FakeClock
) -> None:
    issued = accounts.issue_token(ctx, "bob", "ci", ["read"], days=2)
    assert issued.expires_at == clock.now() + timedelta(days=2)
    clock.advance(3600)
    accounts.revoke_token(ctx, issued.id)
    (listed,) = [t for t in accounts.list_tokens(ctx) if t.id == issued.id]
    assert listed.revoked and listed.expires_at == (clock.now() + timedelta(days=2, hours=-1)).isoformat()
    assert audit.verify_log(ctx.db, ctx.audit_key).ok
