"""What a call of the protocol can give back: the scope of a key, claim()'s four outcomes, and
the results a runner answers from (an outcome, the owner's completed answer, or the business
id's verdict). Plain frozen dataclasses: match on them (``match outcome: case Replay(): ...``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class Caller(NamedTuple):
    """Who is asking, from the service's own authentication (never from the request body)."""

    tenant: str
    principal: str


@dataclass(frozen=True)
class Scope:
    """The scope of an idempotency key: tenant, principal and operation. The same key in two
    scopes names two unrelated records."""

    tenant: str
    principal: str
    operation: str

    @classmethod
    def of(cls, caller: Caller, operation: str) -> Scope:
        return cls(caller.tenant, caller.principal, operation)


@dataclass(frozen=True)
class Owner:
    """The key is this transaction's: do the business write, complete(), commit."""

    replay_deadline: datetime


@dataclass(frozen=True)
class Replay:
    """The key's request was answered: send the stored answer again, byte for byte."""

    status_code: int
    body_text: str
    resource_id: str | None
    replay_deadline: datetime


@dataclass(frozen=True)
class KeyReused:
    """The key was used for another intent: refuse, and say nothing of the stored answer."""


@dataclass(frozen=True)
class Expired:
    """The key's replay window is over: never executed again; point at the resource."""

    resource_id: str | None
    replay_deadline: datetime
    expired_at: datetime | None


#: claim()'s outcomes (lookup() gives the last three, or None).
Outcome = Owner | Replay | KeyReused | Expired


@dataclass(frozen=True)
class Completed:
    """The owner's answer, stored by complete(): send ``body_text`` as it is (every replay will
    send exactly this text). ``replay_deadline`` is None on a route whose key is optional, for a
    request that sent none."""

    status_code: int
    body_text: str
    resource_id: str | None
    replay_deadline: datetime | None


@dataclass(frozen=True)
class BusinessRecord:
    """What a business id's ``read`` found: the object that holds the business id, its answer
    text (the bytes its own key replays), and whether it is this caller's same request (same
    principal, same parameters)."""

    same: bool
    body_text: str
    resource_id: str | None


@dataclass(frozen=True)
class ReplayByBusinessId:
    """A new key for a request whose business id already has its object (SQLSTATE 23505 on the
    business table's unique id), and it is this caller's same request: the existing object,
    answered as a replay. ``status_code`` is 200, as the endpoint answers: this request created
    nothing."""

    status_code: int
    body_text: str
    resource_id: str | None


@dataclass(frozen=True)
class DuplicateBusinessId:
    """A new key whose business id names another caller's, or another intent's, object."""


#: What a runner answers from.
Result = Completed | Replay | KeyReused | Expired | ReplayByBusinessId | DuplicateBusinessId


def outcome_from_row(row: tuple[Any, ...] | None) -> Outcome | None:
    """claim()'s or lookup()'s row as an outcome; None for lookup()'s empty answer."""
    if row is None:
        return None
    outcome, status_code, body_text, resource_id, replay_deadline, expired_at = row
    if outcome == "owner":
        return Owner(replay_deadline)
    if outcome == "replay":
        return Replay(status_code, body_text, resource_id, replay_deadline)
    if outcome == "key_reused":
        return KeyReused()
    if outcome == "expired":
        return Expired(resource_id, replay_deadline, expired_at)
    # A schema newer than api_version() 1 said: the version check keeps this from happening.
    raise ValueError(f"unknown claim outcome {outcome!r}")


def lookup_outcome(row: tuple[Any, ...] | None) -> Replay | KeyReused | Expired | None:
    """lookup()'s row: no outcome, or one of the three a committed record can give."""
    outcome = outcome_from_row(row)
    if isinstance(outcome, Owner):
        raise ValueError("lookup() answered 'owner'")
    return outcome
