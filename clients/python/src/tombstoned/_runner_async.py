"""The transaction runner, asyncio; ``_runner.py``, the sync twin, is generated from it
(tools/async_to_sync.py). One READ COMMITTED transaction per attempt: claim, the caller's
business write only for the owner, complete, commit; every other outcome commits at once.
40001/40P01 run the whole transaction again (bounded); a connection lost after COMMIT was sent
is OutcomeUnknown, never a failure."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from psycopg import AsyncConnection, AsyncCursor
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from . import aio as calls
from ._calls import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_SCHEMA,
    Interval,
    unique_violation,
)
from ._statements import JSONB_TEXT, START
from .errors import ClaimNotCompleted, RetriesExhausted, SerializationFailure, classify
from .outcomes import (
    BusinessRecord,
    Completed,
    DuplicateBusinessId,
    Outcome,
    Owner,
    ReplayByBusinessId,
    Result,
    Scope,
)

#: How many times a transaction runs before RetriesExhausted.
DEFAULT_ATTEMPTS = 3


async def start_transaction(conn: AsyncConnection[Any]) -> None:
    """The one place a runner's transaction starts, right after BEGIN. (Issue 40 adds the
    trace context here.)"""
    await conn.execute(START)


class AsyncTransaction:
    """The owner's transaction, handed to a handler: write the business rows on ``conn``,
    enqueue events, and return ``complete()``'s result. Nothing of it is seen before the runner
    commits; an exception rolls all of it back and frees the key."""

    def __init__(
        self,
        conn: AsyncConnection[Any],
        scope: Scope,
        key: str | None,
        intent: object,
        replay_deadline: datetime | None,
        schema: str,
    ) -> None:
        #: The connection, inside the transaction: the business write goes here.
        self.conn = conn
        self.scope = scope
        #: None on a route whose key is optional, when the request sent none.
        self.key = key
        self.intent = intent
        self.replay_deadline = replay_deadline
        self.schema = schema
        #: What complete() stored, once it was called.
        self.completed: Completed | None = None

    async def execute(self, query: Any, params: Any = None) -> AsyncCursor[Any]:
        """``conn.execute``: a statement of the business write."""
        return await self.conn.execute(query, params)

    async def enqueue_event(self, aggregate_id: str, event_type: str, payload: object) -> UUID:
        """An outbox event of the scope's tenant, committed with the business write."""
        return await calls.enqueue_event(
            self.conn, self.scope.tenant, aggregate_id, event_type, payload, schema=self.schema
        )

    async def complete(
        self, status_code: int, body: object, resource_id: str | None = None
    ) -> Completed:
        """Stores the answer on the key's record; the runner sends exactly its text."""
        if self.key is None:
            cursor = await self.conn.execute(JSONB_TEXT, (Jsonb(body),))
            row = await cursor.fetchone()
            text: str = row[0] if row else ""
        else:
            text = await calls.complete(
                self.conn,
                self.scope,
                self.key,
                status_code,
                body,
                resource_id,
                schema=self.schema,
            )
        self.completed = Completed(status_code, text, resource_id, self.replay_deadline)
        return self.completed


#: A handler: the owner's business write. Return ``tx.complete(...)``.
AsyncHandler = Callable[[AsyncTransaction], Awaitable[Completed | None]]

#: Reads the object that holds a business id, in a transaction of its own: a BusinessRecord
#: (``same`` when it is this caller's same request), or None when there is none (any more).
AsyncRead = Callable[[AsyncConnection[Any], Scope, Any], Awaitable[BusinessRecord | None]]


@dataclass(frozen=True)
class AsyncBusinessId:
    """The business table's unique business id: the second line of defence, for a retry that
    comes under a new key. A unique violation (23505) on ``constraint`` rolls the attempt back
    (the new key is not recorded) and ``read`` looks the object up in a new transaction: the
    same request gets it as a replay (200), anything else a 409; None (the object gone
    meanwhile) runs the whole transaction again."""

    constraint: str
    read: AsyncRead


class _Again(Exception):
    """The business id's object was gone by the time it was read: run the transaction again."""


class AsyncTransactions(Protocol):
    """Where a runner's transactions come from: a context that yields a connection inside a
    started transaction, commits on a normal exit and rolls back on an exception."""

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


class _AsyncPoolTransactions:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self.pool.connection() as conn, conn.transaction():
            await start_transaction(conn)
            yield conn


class _AsyncConnectionTransactions:
    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        if self.conn.info.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError(
                "the runner starts its own transactions: give it a connection outside any"
            )
        async with self.conn.transaction():
            await start_transaction(self.conn)
            yield self.conn


@dataclass(frozen=True)
class _Claiming:
    """What every attempt of one request claims with."""

    scope: Scope
    key: str | None
    intent: object
    replay_window: Interval
    lock_timeout: Interval


class AsyncIdempotency:
    """Runs requests under the protocol on a pool (or one connection, or any
    AsyncTransactions). ``replay_window`` and ``lock_timeout`` apply to every claim."""

    def __init__(
        self,
        connections: AsyncConnectionPool[Any] | AsyncConnection[Any] | AsyncTransactions,
        *,
        schema: str = DEFAULT_SCHEMA,
        replay_window: Interval = DEFAULT_REPLAY_WINDOW,
        lock_timeout: Interval = DEFAULT_LOCK_TIMEOUT,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if isinstance(connections, AsyncConnectionPool):
            self.transactions: AsyncTransactions = _AsyncPoolTransactions(connections)
        elif isinstance(connections, AsyncConnection):
            self.transactions = _AsyncConnectionTransactions(connections)
        else:
            self.transactions = connections
        self.schema = schema
        self.replay_window = replay_window
        self.lock_timeout = lock_timeout
        self.attempts = attempts

    async def execute(
        self,
        scope: Scope,
        key: str | None,
        intent: object,
        handler: AsyncHandler,
        *,
        business_id: AsyncBusinessId | None = None,
        replay_window: Interval | None = None,
        lock_timeout: Interval | None = None,
    ) -> Result:
        """One request: the result to answer (``tombstoned.http_answer``), or a
        TombstonedError. ``key`` None runs ``handler`` in a plain transaction (a route whose key
        is optional). ``replay_window`` and ``lock_timeout`` override the runner's for this
        call. Errors that are none of the SQL API's (the handler's own) propagate unchanged,
        after the rollback."""
        claiming = _Claiming(
            scope,
            key,
            intent,
            self.replay_window if replay_window is None else replay_window,
            self.lock_timeout if lock_timeout is None else lock_timeout,
        )
        failure: SerializationFailure | None = None
        for _ in range(self.attempts):
            try:
                return await self._attempt(claiming, handler, business_id)
            except SerializationFailure as e:
                failure = e
            except _Again:
                failure = None
        raise RetriesExhausted(
            self.attempts, sqlstate=failure.sqlstate if failure else None
        ) from failure

    async def _attempt(
        self,
        claiming: _Claiming,
        handler: AsyncHandler,
        business_id: AsyncBusinessId | None,
    ) -> Result:
        scope, key, intent = claiming.scope, claiming.key, claiming.intent
        committing = False
        outcome: Outcome | None = None
        tx: AsyncTransaction | None = None
        try:
            async with self.transactions.transaction() as conn:
                if key is not None:
                    outcome = await calls.claim(
                        conn,
                        scope,
                        key,
                        intent,
                        claiming.replay_window,
                        claiming.lock_timeout,
                        schema=self.schema,
                    )
                if outcome is None or isinstance(outcome, Owner):
                    deadline = outcome.replay_deadline if outcome else None
                    tx = AsyncTransaction(conn, scope, key, intent, deadline, self.schema)
                    await handler(tx)
                    if key is None and tx.completed is None:
                        # No record to refuse the commit (TS003): refuse it here.
                        raise ClaimNotCompleted("the handler returned without complete()")
                # Whatever the outcome, the transaction ends now: a replay's share lock would
                # hold a cleanup batch back.
                committing = True
        except Exception as e:
            if business_id is not None and unique_violation(e) == business_id.constraint:
                return await self._existing(business_id, scope, intent)
            mapped = classify(e, at_commit=committing)
            if mapped is None or mapped is e:
                raise
            raise mapped from e
        if tx is None:
            assert outcome is not None and not isinstance(outcome, Owner)
            return outcome
        assert tx.completed is not None, "COMMIT refuses a claim without complete() (TS003)"
        return tx.completed

    async def _existing(
        self, business_id: AsyncBusinessId, scope: Scope, intent: object
    ) -> ReplayByBusinessId | DuplicateBusinessId:
        try:
            async with self.transactions.transaction() as conn:
                found = await business_id.read(conn, scope, intent)
        except Exception as e:
            mapped = classify(e)
            if mapped is None or mapped is e:
                raise
            raise mapped from e
        if found is None:
            raise _Again()
        if not found.same:
            return DuplicateBusinessId()
        return ReplayByBusinessId(200, found.body_text, found.resource_id)
