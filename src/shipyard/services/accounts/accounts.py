"""Users, service accounts, passwords (argon2id) and API tokens (random, shown once, hashed).

A token reads ``shy_<id>_<secret>``: the id finds the row, and only the SHA-256 of the secret is
stored, compared in constant time. Failed password logins are throttled per (user name, client
address), for names that exist and names that do not alike, for a time that doubles with every
failure past a few (OWASP's authentication guidance): guessing is slow, a typo costs nothing,
a guesser elsewhere never locks the real user out, and no answer tells which names exist.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, select, update

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import SignInLink, Token, User, rows_changed
from shipyard.domain.text import composed, has_control_character
from shipyard.errors import (
    Conflict,
    Forbidden,
    InvalidSpec,
    NotFound,
    Unauthenticated,
)
from shipyard.schemas.requests import DEFAULT_TOKEN_DAYS, MAX_TOKEN_DAYS, MIN_PASSWORD, SCOPES, USER_NAME
from shipyard.schemas.views import IssuedTokenView, TokenView, UserView
from shipyard.services.accounts import rbac
from shipyard.services.accounts.logins import check_login, hasher
from shipyard.services.caches.verified_tokens import VerifiedToken
from shipyard.services.context import ServiceContext

TOKEN_PREFIX = "shy"
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""A token's ``last_used_at`` is written at most this often (not on every request), which is
enough to find the tokens nobody uses any more."""


@dataclass(frozen=True, slots=True)
class IssuedToken:
    id: str
    token: str
    """The secret: shown this once, never stored."""
    expires_at: datetime | None

    def view(self) -> IssuedTokenView:
        expires_at = self.expires_at.isoformat() if self.expires_at else None
        return IssuedTokenView(id=self.id, token=self.token, expires_at=expires_at)


def _check_name(name: str) -> None:
    if not USER_NAME.match(name):
        raise InvalidSpec(
            f"user name {name!r} is not valid",
            hint="use 1-64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit",
        )


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise InvalidSpec(
            f"the password has {len(password)} characters; at least {MIN_PASSWORD} are needed",
            hint="use a longer passphrase",
        )


def create_user(
    ctx: ServiceContext, name: str, password: str | None, *, admin: bool = False, service: bool = False
) -> UserView:
    """A person (with a password) or a service account (tokens only); admins only."""
    _check_name(name)
    if not service:
        if password is None:
            raise InvalidSpec(f"user {name!r} needs a password", hint="give one, or create a service account")
        _check_password(password)
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.USER_MANAGE, f"user/{name}")
        if session.get(User, name) is not None:
            raise Conflict(f"user {name!r} already exists", hint="pick another name")
        user = User(
            name=name,
            password_hash=hasher.hash(password) if password and not service else None,
            is_admin=admin,
            is_service=service,
            disabled=False,
        )
        session.add(user)
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "user.create",
            f"user/{name}",
            detail={"admin": admin, "service": service},
        )
        return _user_view(user)


def ensure_initial_admin(ctx: ServiceContext, spec: str) -> bool:
    """``NAME:PASSWORD`` becomes the first admin when no user exists yet; later starts ignore it."""
    name, sep, password = spec.partition(":")
    if not sep or not name or not password:
        raise InvalidSpec(
            "the initial admin must be given as NAME:PASSWORD",
            hint="e.g. SHIPYARD_INIT_ADMIN=admin:<passphrase>",
        )
    _check_name(name)
    _check_password(password)
    with ctx.db.transaction() as session:
        if session.scalar(select(func.count()).select_from(User)):
            return False
        session.add(
            User(
                name=name,
                password_hash=hasher.hash(password),
                is_admin=True,
                is_service=False,
                disabled=False,
            )
        )
        audit.append(session, ctx.audit_key, ctx.actor, "user.create", f"user/{name}", detail={"admin": True})
    return True


def login(ctx: ServiceContext, name: str, password: str, *, token_days: float = 1.0) -> IssuedToken:
    """Check a password and issue a session token; every attempt is audited. A wrong password,
    an unknown or disabled user and a user without a password get the same answer after the
    same work; a (name, address) pair past its free failures gets ``Throttled`` without a check."""
    check_login(ctx, name, password)
    who = audit.Actor(name=name, source=ctx.actor.source)
    return issue_token(ctx.acting_as(who), name, "login", None, days=token_days, audit_as="auth.login")


def issue_token(
    ctx: ServiceContext,
    user: str,
    name: str,
    scopes: list[str] | None,
    *,
    days: float | None = DEFAULT_TOKEN_DAYS,
    audit_as: str = "token.issue",
) -> IssuedToken:
    """A new token for ``user`` (oneself, or anyone for an admin); ``scopes`` None: all that
    both the user may hold (admin only for admins) and the caller's own credential holds. A
    token never mints one worth more than itself: a leaked ``read, write`` token of an admin
    cannot become an admin's."""
    if not 0 < len(name) <= 64 or has_control_character(name):
        raise InvalidSpec(
            f"token name {name!r} is not valid: it is a label of 1-64 printable characters",
            hint='name what the token is for, e.g. "ci deploy"',
        )
    if composed(name) != name:
        raise InvalidSpec(
            f"token name {name!a} is not in Unicode normal form C: it prints like another name",
            hint=f"write it with composed characters: {composed(name)!r}",
        )
    unknown = [s for s in scopes or () if s not in SCOPES]
    if unknown or scopes == []:
        raise InvalidSpec(
            f"unknown token scope {', '.join(unknown) or '(none)'}", hint=f"use {', '.join(SCOPES)}"
        )
    if days is not None and not 0 < days <= MAX_TOKEN_DAYS:
        raise InvalidSpec(
            f"a token lives more than 0 and at most {MAX_TOKEN_DAYS:g} days, not {days:g}",
            hint="e.g. --days 30",
        )
    with ctx.db.transaction() as session:
        if user != ctx.actor.name:
            rbac.require(ctx, session, Permission.USER_MANAGE, f"user/{user}")
        owner = session.get(User, user)
        if owner is None:
            raise NotFound(f"no user named {user!r}", hint="`shipyard users list` shows them")
        held = ctx.actor.scopes
        if scopes is None:
            scopes = [s for s in SCOPES if s in held and (s != "admin" or owner.is_admin)]
        if "admin" in scopes and not owner.is_admin:
            raise InvalidSpec(
                f"user {user!r} is no admin; a token cannot hold the admin scope", hint="drop it"
            )
        beyond = [s for s in scopes if s not in held]
        if beyond or not scopes:
            raise Forbidden(
                f"this credential holds the scopes {', '.join(sorted(held))}; it cannot issue a "
                f"token with {', '.join(beyond) or 'no scope'}",
                hint="ask for fewer scopes, or sign in with the password for a full session",
            )
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        expires = ctx.clock.now() + timedelta(days=days) if days is not None else None
        session.add(
            Token(
                id=token_id,
                user=user,
                secret_hash=_digest(secret),
                name=name,
                scopes=list(scopes),
                expires_at=expires,
            )
        )
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            audit_as,
            f"token/{token_id}",
            detail={"user": user, "scopes": scopes},
        )
    return IssuedToken(id=token_id, token=f"{TOKEN_PREFIX}_{token_id}_{secret}", expires_at=expires)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


_TOKEN_CHECK = (
    select(
        Token.secret_hash,
        Token.expires_at,
        Token.revoked_at,
        Token.last_used_at,
        Token.scopes,
        User.name,
        User.is_admin,
        User.disabled,
    )
    .join(User, User.name == Token.user)
    .where(Token.id == bindparam("token_id"))
)
"""Built once: a statement object made per request costs more CPU than its round trip."""
_TOKEN_USED = update(Token).where(Token.id == bindparam("token_id")).values(last_used_at=bindparam("now"))


def authenticate(ctx: ServiceContext, bearer: str, source: str) -> audit.Actor:
    """The caller a bearer token stands for, or ``Unauthenticated`` (tampered, expired, revoked)."""
    token_id, secret = _parse_bearer(bearer)
    cache = ctx.verified_tokens
    verified = cache.get(token_id) if cache is not None else None
    if verified is None:
        verified = _read_token(ctx, token_id)
        if verified is None:
            raise _invalid()
        if cache is not None:
            cache.put(token_id, verified)
    return _accept(ctx, verified, secret, source)


def authenticate_cached(ctx: ServiceContext, bearer: str, source: str) -> audit.Actor | None:
    """``authenticate`` for a token this server read a moment ago, without touching the database
    (so without blocking); None when it has to be read."""
    token_id, secret = _parse_bearer(bearer)
    verified = ctx.verified_tokens.get(token_id) if ctx.verified_tokens is not None else None
    return None if verified is None else _accept(ctx, verified, secret, source)


def _invalid() -> Unauthenticated:
    return Unauthenticated("invalid, expired or revoked token", hint="log in again: shipyard login URL")


LINK_PREFIX = "shl"
LINK_TTL = timedelta(minutes=2)
"""A sign-in link (``shipyard ui``) works for two minutes, once."""


def local_account(ctx: ServiceContext, name: str) -> str:
    """The account of this machine's user on its own home (``shipyard ui``): made once, as an
    admin without a password (it signs in by link only), and returned by name."""
    with ctx.db.read() as session:
        found = session.get(User, name)
    if found is None:
        create_user(ctx, name, None, admin=True, service=True)
    return name


def sign_in_link(ctx: ServiceContext, user: str) -> IssuedToken:
    """A one-time credential that ``redeem_link`` exchanges, within two minutes, for a dashboard
    session of ``user`` (oneself, or anyone for an admin). It is no API token, and no API
    token is one: naming a token like a link makes nothing of it."""
    link_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    expires = ctx.clock.now() + LINK_TTL
    with ctx.db.transaction() as session:
        if user != ctx.actor.name:
            rbac.require(ctx, session, Permission.USER_MANAGE, f"user/{user}")
        if session.get(User, user) is None:
            raise NotFound(f"no user named {user!r}", hint="`shipyard users list` shows them")
        session.add(SignInLink(id=link_id, user=user, secret_hash=_digest(secret), expires_at=expires))
        audit.append(session, ctx.audit_key, ctx.actor, "auth.link", f"user/{user}", detail={"link": link_id})
    return IssuedToken(id=link_id, token=f"{LINK_PREFIX}_{link_id}_{secret}", expires_at=expires)


def redeem_link(ctx: ServiceContext, link: str, source: str, *, session_days: float) -> IssuedToken:
    """A dashboard session for the holder of a sign-in link, used up on the way (a link copied
    from a browser's history signs nobody in); ``Unauthenticated`` for anything else."""
    link_id, secret = _parse_credential(link, LINK_PREFIX)
    now = ctx.clock.now()
    with ctx.db.transaction() as session:
        found = session.get(SignInLink, link_id)
        if found is None or not hmac.compare_digest(found.secret_hash, _digest(secret)):
            raise _invalid()
        used = session.execute(
            update(SignInLink)
            .where(SignInLink.id == link_id, SignInLink.used_at.is_(None), SignInLink.expires_at > now)
            .values(used_at=now)
        )
        owner = session.get(User, found.user)
        if not rows_changed(used) or owner is None or owner.disabled:
            raise _invalid()
    who = ctx.acting_as(audit.Actor(name=found.user, source=source))
    return issue_token(who, found.user, "login", None, days=session_days, audit_as="auth.login")


def token_id_of(bearer: str) -> str:
    """The id of a token (what ``revoke_token`` takes), or ``Unauthenticated`` if it is none."""
    return _parse_bearer(bearer)[0]


def _parse_bearer(bearer: str) -> tuple[str, str]:
    return _parse_credential(bearer, TOKEN_PREFIX)


def _parse_credential(credential: str, kind: str) -> tuple[str, str]:
    """``KIND_ID_SECRET`` -> (id, secret), or ``Unauthenticated``."""
    prefix, _, rest = credential.partition("_")
    found_id, _, secret = rest.partition("_")
    if prefix != kind or not found_id or not secret:
        raise _invalid()
    return found_id, secret


def _accept(ctx: ServiceContext, verified: VerifiedToken, secret: str, source: str) -> audit.Actor:
    if not hmac.compare_digest(verified.secret_hash, _digest(secret)):
        raise _invalid()
    if verified.expires_at is not None and verified.expires_at <= ctx.clock.now():
        raise _invalid()
    return audit.Actor(name=verified.user, source=source, is_admin=verified.is_admin, scopes=verified.scopes)


def _read_token(ctx: ServiceContext, token_id: str) -> VerifiedToken | None:
    """The token's row, unless it is revoked or its user disabled; notes that it was used."""
    with ctx.db.connect() as connection:
        found = connection.execute(_TOKEN_CHECK, {"token_id": token_id}).first()
        if found is None or found.revoked_at is not None or found.disabled:
            return None
        now = ctx.clock.now()
        if found.last_used_at is None or now - found.last_used_at > LAST_USED_RESOLUTION:
            connection.execute(_TOKEN_USED, {"token_id": token_id, "now": now})  # autocommit
    return VerifiedToken(
        secret_hash=found.secret_hash,
        user=found.name,
        is_admin=found.is_admin and "admin" in found.scopes,
        scopes=frozenset(found.scopes),
        expires_at=found.expires_at,
        read_at=ctx.clock.monotonic(),
    )


def revoke_token(ctx: ServiceContext, token_id: str) -> None:
    missing = NotFound(f"no token {token_id!r}", hint="`shipyard tokens list` shows yours")
    with ctx.db.transaction() as session:
        token = session.get(Token, token_id)
        if token is None:
            raise missing
        if token.user != ctx.actor.name and not ctx.actor.is_admin:
            # Another's token is none of the caller's business: answered as one that does not exist.
            rbac.deny_as_missing(ctx, Permission.USER_MANAGE, f"token/{token_id}", None, missing)
        if token.revoked_at is None:
            token.revoked_at = ctx.clock.now()
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "token.revoke",
            f"token/{token_id}",
            detail={"user": token.user},
        )
    if ctx.verified_tokens is not None:  # after the commit: a request meanwhile must not re-read it
        ctx.verified_tokens.forget(token_id)


def list_tokens(ctx: ServiceContext) -> list[TokenView]:
    """The caller's tokens (an admin sees everyone's); never their secrets."""
    with ctx.db.transaction() as session:
        query = select(Token).order_by(Token.created_at)
        if not ctx.actor.is_admin:
            query = query.where(Token.user == ctx.actor.name)
        return [
            TokenView(
                id=t.id,
                user=t.user,
                name=t.name,
                scopes=t.scopes,
                created_at=t.created_at.isoformat(),
                expires_at=t.expires_at.isoformat() if t.expires_at else None,
                last_used_at=t.last_used_at.isoformat() if t.last_used_at else None,
                revoked=t.revoked_at is not None,
            )
            for t in session.scalars(query)
        ]


def list_users(ctx: ServiceContext) -> list[UserView]:
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.USER_MANAGE, "users")
        return [_user_view(u) for u in session.scalars(select(User).order_by(User.name))]


def _user_view(user: User) -> UserView:
    return UserView(name=user.name, admin=user.is_admin, service=user.is_service, disabled=user.disabled)
