"""The FastAPI adapter (extra ``[fastapi]``), on ``AsyncIdempotency``. A route declares its
operation and, as FastAPI dependencies, who the caller is and what the normalised intent is;
the adapter reads the Idempotency-Key, runs the handler's business write inside the claim's
transaction, and answers every other case itself::

    @app.post("/payments")
    @idempotent(runner, operation="create-payment", caller=authenticate, intent=parse_payment,
                resource_url=lambda payment_id: f"/payments/{payment_id}")
    async def create_payment(tx: AsyncTransaction, payment: Payment) -> Completed:
        ...  # the INSERT on tx.conn, tx.enqueue_event(...)
        return await tx.complete(201, body, payment_id)

``caller`` and ``intent`` (plain functions, sync or async, with FastAPI's parameters) run before
any transaction: raise ``InvalidRequest`` there to refuse with a problem (``HTTPException``
works too), which consumes no key. Replays, 422, 410, 409 + Retry-After and the 503s never
reach the handler."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Depends, Header, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ._adapter import Route
from ._calls import Interval
from ._runner_async import AsyncBusinessId, AsyncIdempotency, AsyncTransaction
from .answers import ResourceUrl
from .errors import InvalidRequest, TombstonedError
from .outcomes import Caller, Completed, Result, Scope

__all__ = ["RouteHandler", "idempotent"]

Intent = TypeVar("Intent")

#: The route's business write: ``(tx, intent)``; return ``await tx.complete(...)``.
RouteHandler = Callable[[AsyncTransaction, Intent], Awaitable[Completed | None]]


def _refusable(dependency: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``dependency`` as FastAPI resolves it (its parameters, read through ``__wrapped__``), an
    InvalidRequest it raises given back as its value: FastAPI runs dependencies before the
    endpoint, whose answer it then is. A sync dependency runs in the thread pool, as FastAPI
    runs it."""
    is_async = inspect.iscoroutinefunction(dependency) or inspect.iscoroutinefunction(
        getattr(dependency, "__call__", None)  # noqa: B004
    )

    @functools.wraps(dependency)
    async def resolved(*args: Any, **kwargs: Any) -> Any:
        try:
            if is_async:
                return await dependency(*args, **kwargs)
            return await run_in_threadpool(dependency, *args, **kwargs)
        except InvalidRequest as refused:
            return refused

    return resolved


def idempotent(
    idempotency: AsyncIdempotency,
    *,
    operation: str,
    caller: Callable[..., Any],
    intent: Callable[..., Any],
    resource_url: ResourceUrl | None = None,
    resource_name: str = "resource",
    business_id: AsyncBusinessId | None = None,
    key_optional: bool = False,
    replay_window: Interval | None = None,
    lock_timeout: Interval | None = None,
) -> Callable[[RouteHandler[Intent]], Callable[..., Awaitable[Response]]]:
    """Makes a handler an idempotent FastAPI endpoint. ``caller``: a dependency giving the
    authenticated Caller(tenant, principal). ``intent``: a dependency giving the normalised
    intent (what the fingerprint covers), handed to the handler. ``business_id``: the 23505
    hook. ``replay_window``, ``lock_timeout``: this route's, instead of the runner's."""
    route = Route(operation, resource_url, resource_name, key_optional, replay_window, lock_timeout)
    who_asks, what_for = _refusable(caller), _refusable(intent)

    def decorate(handler: RouteHandler[Intent]) -> Callable[..., Awaitable[Response]]:
        # Dependencies run in this order: the caller (401 first), the intent (400), then the
        # key. The header parameter is there for the OpenAPI document; the key is read from
        # the raw headers, which can say it came twice.
        async def endpoint(
            request: Request,
            who: Caller | InvalidRequest = Depends(who_asks),
            normalised: Any = Depends(what_for),
            idempotency_key: str | None = Header(
                default=None,
                alias="Idempotency-Key",
                description="1 to 255 visible ASCII characters; the same for every retry",
            ),
        ) -> Response:
            result: Result | TombstonedError
            try:
                if isinstance(who, InvalidRequest):
                    raise who
                if isinstance(normalised, InvalidRequest):
                    raise normalised
                key = route.key(request.headers.getlist("idempotency-key"))

                async def write(tx: AsyncTransaction) -> Completed | None:
                    return await handler(tx, normalised)

                result = await idempotency.execute(
                    Scope.of(who, operation),
                    key,
                    normalised,
                    write,
                    business_id=business_id,
                    replay_window=replay_window,
                    lock_timeout=lock_timeout,
                )
            except TombstonedError as e:
                result = e
            reply = route.answer(result)
            return Response(reply.body, reply.status, reply.headers)

        # Not functools.wraps: FastAPI would read the handler's signature through __wrapped__.
        endpoint.__name__ = getattr(handler, "__name__", endpoint.__name__)
        endpoint.__qualname__ = getattr(handler, "__qualname__", endpoint.__qualname__)
        endpoint.__doc__ = handler.__doc__
        return endpoint

    return decorate
