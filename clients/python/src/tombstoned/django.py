"""The Django adapter (extra ``[django]``), on the sync ``Idempotency`` over Django's own
database connection (the postgresql backend on psycopg 3), so the business write is ORM code in
the claim's transaction::

    runner = tombstoned.django.idempotency(replay_window=timedelta(hours=24))

    @idempotent(runner, operation="create-payment", caller=authenticate, intent=parse_payment,
                resource_url=lambda payment_id: f"/payments/{payment_id}")
    def create_payment(tx: Transaction, payment: PaymentIntent) -> Completed:
        row = Payment.objects.create(...)  # inside the claim's transaction
        tx.enqueue_event(str(row.pk), "payment.created", row.as_json())
        return tx.complete(201, row.as_json(), str(row.pk))

``caller`` and ``intent`` take the request and return the Caller / the normalised intent; they
refuse the request before any transaction (no key is consumed) by raising ``InvalidRequest``
(a problem) or returning an HttpResponse. The view
manages its own transaction: it is exempt from ATOMIC_REQUESTS, and must not run inside
``transaction.atomic``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from ._adapter import Route
from ._calls import DEFAULT_LOCK_TIMEOUT, DEFAULT_REPLAY_WINDOW, DEFAULT_SCHEMA, Interval
from ._runner import DEFAULT_ATTEMPTS, BusinessId, Idempotency, Transaction, start_transaction
from .answers import ResourceUrl
from .errors import TombstonedError
from .outcomes import Caller, Completed, Result, Scope

__all__ = ["DjangoTransactions", "ViewHandler", "idempotency", "idempotent"]

Intent = TypeVar("Intent")

#: The view's business write: ``(tx, intent)``; return ``tx.complete(...)``.
ViewHandler = Callable[[Transaction, Intent], Completed | None]
View = Callable[..., HttpResponseBase]


class DjangoTransactions:
    """The runner's transactions on Django's connection ``using``: ``transaction.atomic``
    (outermost), whose raw psycopg connection the protocol's calls share with the ORM."""

    def __init__(self, using: str = "default") -> None:
        self.using = using

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        connection = connections[self.using]
        if connection.in_atomic_block:
            raise RuntimeError(
                "an idempotent view runs its own transaction: not inside transaction.atomic "
                "(and not under ATOMIC_REQUESTS: idempotent() exempts the views it makes)"
            )
        with transaction.atomic(using=self.using):
            raw = connection.connection
            if not isinstance(raw, psycopg.Connection):
                raise RuntimeError(
                    f"database {self.using!r}: tombstoned needs Django's postgresql backend on "
                    "psycopg 3"
                )
            start_transaction(raw)
            yield raw


def idempotency(
    *,
    using: str = "default",
    schema: str = DEFAULT_SCHEMA,
    replay_window: Interval = DEFAULT_REPLAY_WINDOW,
    lock_timeout: Interval = DEFAULT_LOCK_TIMEOUT,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Idempotency:
    """A runner on Django's database ``using``."""
    return Idempotency(
        DjangoTransactions(using),
        schema=schema,
        replay_window=replay_window,
        lock_timeout=lock_timeout,
        attempts=attempts,
    )


def idempotent(
    idempotency: Idempotency,
    *,
    operation: str,
    caller: Callable[[HttpRequest], Caller | HttpResponseBase],
    intent: Callable[[HttpRequest], Any],
    resource_url: ResourceUrl | None = None,
    resource_name: str = "resource",
    business_id: BusinessId | None = None,
    key_optional: bool = False,
    replay_window: Interval | None = None,
    lock_timeout: Interval | None = None,
) -> Callable[[ViewHandler[Intent]], View]:
    """Makes a handler an idempotent Django view. ``caller(request)``: the authenticated
    Caller(tenant, principal), or a response refusing the request. ``intent(request)``: the
    normalised intent (what the fingerprint covers), or a response refusing it.
    ``business_id``: the 23505 hook. ``replay_window``, ``lock_timeout``: this route's, instead
    of the runner's."""
    route = Route(operation, resource_url, resource_name, key_optional, replay_window, lock_timeout)
    using = getattr(idempotency.transactions, "using", None)

    def decorate(handler: ViewHandler[Intent]) -> View:
        def view(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
            result: Result | TombstonedError
            try:
                who = caller(request)
                if isinstance(who, HttpResponseBase):
                    return who
                normalised = intent(request)
                if isinstance(normalised, HttpResponseBase):
                    return normalised
                # WSGI folds a repeated header into one value joined by ", ": the space makes
                # it an invalid key, as the rule for two headers wants.
                sent = request.headers.get("Idempotency-Key")
                key = route.key([] if sent is None else [sent])

                def write(tx: Transaction) -> Completed | None:
                    return handler(tx, normalised)

                result = idempotency.execute(
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
            return HttpResponse(reply.body, status=reply.status, headers=reply.headers)

        view.__name__ = getattr(handler, "__name__", view.__name__)
        view.__qualname__ = getattr(handler, "__qualname__", view.__qualname__)
        view.__doc__ = handler.__doc__
        # ATOMIC_REQUESTS would wrap the view's own transaction in another one.
        return transaction.non_atomic_requests(using)(view) if using else view

    return decorate
