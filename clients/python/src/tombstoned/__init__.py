"""tombstoned's official Python client: the idempotency protocol of tombstoned's SQL API in
your service's own PostgreSQL transaction, on psycopg 3 (sync and asyncio).

- The core, any framework: ``claim``, ``complete``, ``enqueue_event``, ``lookup`` (sync here and
  in ``tombstoned.core``; asyncio twins in ``tombstoned.aio``), their outcomes, one error class
  per SQLSTATE, and ``http_answer()``, the HTTP answer to each.
- The runners, ``Idempotency`` / ``AsyncIdempotency``: the whole transaction around your
  business write, retries and the commit whose outcome is unknown included.
- The adapters: ``tombstoned.fastapi`` and ``tombstoned.django`` (extras ``[fastapi]``,
  ``[django]``).
"""

from ._calls import (
    API_VERSION,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_SCHEMA,
    Interval,
)
from ._runner import BusinessId, Idempotency, Transaction, Transactions
from ._runner_async import (
    DEFAULT_ATTEMPTS,
    AsyncBusinessId,
    AsyncIdempotency,
    AsyncTransaction,
    AsyncTransactions,
)
from .answers import PROBLEM_TYPE_PREFIX, HttpAnswer, http_answer, read_idempotency_key
from .core import check_api_version, claim, complete, enqueue_event, lookup
from .errors import (
    ClaimedTwice,
    ClaimNotCompleted,
    DatabaseUnavailable,
    InProgress,
    InvalidArgument,
    InvalidIdempotencyKey,
    InvalidRequest,
    NotAllowed,
    NotClaimed,
    OutcomeUnknown,
    OutOfResources,
    ReadOnly,
    RetriesExhausted,
    SerializationFailure,
    TombstonedError,
    UnknownApiVersion,
    WrongIsolation,
    classify,
)
from .outcomes import (
    BusinessRecord,
    Caller,
    Completed,
    DuplicateBusinessId,
    Expired,
    KeyReused,
    Outcome,
    Owner,
    Replay,
    ReplayByBusinessId,
    Result,
    Scope,
)

__version__ = "0.1.0"

__all__ = [
    "API_VERSION",
    "DEFAULT_ATTEMPTS",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_SCHEMA",
    "PROBLEM_TYPE_PREFIX",
    "AsyncBusinessId",
    "AsyncIdempotency",
    "AsyncTransaction",
    "AsyncTransactions",
    "BusinessId",
    "BusinessRecord",
    "Caller",
    "ClaimNotCompleted",
    "ClaimedTwice",
    "Completed",
    "DatabaseUnavailable",
    "DuplicateBusinessId",
    "Expired",
    "HttpAnswer",
    "Idempotency",
    "InProgress",
    "Interval",
    "InvalidArgument",
    "InvalidIdempotencyKey",
    "InvalidRequest",
    "KeyReused",
    "NotAllowed",
    "NotClaimed",
    "OutOfResources",
    "Outcome",
    "OutcomeUnknown",
    "Owner",
    "ReadOnly",
    "Replay",
    "ReplayByBusinessId",
    "Result",
    "RetriesExhausted",
    "Scope",
    "SerializationFailure",
    "TombstonedError",
    "Transaction",
    "Transactions",
    "UnknownApiVersion",
    "WrongIsolation",
    "check_api_version",
    "claim",
    "classify",
    "complete",
    "enqueue_event",
    "http_answer",
    "lookup",
    "read_idempotency_key",
]
