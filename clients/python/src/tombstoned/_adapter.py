"""What the framework adapters share: a route's declaration and its answers (logged once, with
the error's class and SQLSTATE only: never a key, a body or a scope)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ._calls import Interval
from .answers import HttpAnswer, ResourceUrl, http_answer, read_idempotency_key
from .errors import TombstonedError
from .outcomes import Result

logger = logging.getLogger("tombstoned")


@dataclass(frozen=True)
class Route:
    """An idempotent route: its operation (the scope's third part), how a resource_id becomes a
    URL (Location, and the 410's members), the name of its resource in the 410 (``payment``:
    ``payment_id`` and ``payment_url``), whether a request may come without a key, and the
    replay window and lock timeout of its claims (None: the runner's)."""

    operation: str
    resource_url: ResourceUrl | None = None
    resource_name: str = "resource"
    key_optional: bool = False
    replay_window: Interval | None = None
    lock_timeout: Interval | None = None

    def key(self, values: Sequence[str]) -> str | None:
        return read_idempotency_key(values, key_optional=self.key_optional)

    def answer(self, result: Result | TombstonedError) -> HttpAnswer:
        reply = http_answer(
            result, resource_url=self.resource_url, resource_name=self.resource_name
        )
        if isinstance(result, TombstonedError):
            level = {500: logging.ERROR, 503: logging.WARNING}.get(reply.status, logging.INFO)
            logger.log(
                level,
                "%s: %s (SQLSTATE %s) -> %d",
                self.operation,
                type(result).__name__,
                result.sqlstate,
                reply.status,
            )
        return reply
