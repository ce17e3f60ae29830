"""The Django test app's views."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase

import tombstoned
import tombstoned.django
from payments_api import (
    BRIEF_WINDOW,
    IMPATIENT,
    OPERATION,
    PATIENT,
    WINDOW,
    HandlerFailed,
    caller_of,
    parse_payment,
    payment_url,
)
from support import BUSINESS_CONSTRAINT, NOT_GRANTED, SCHEMA, read_payment
from tombstoned.django import idempotent

from .models import Payment


def authenticate(request: HttpRequest) -> tombstoned.Caller | HttpResponseBase:
    """A refusal as a response of the app's own."""
    try:
        return caller_of(request.headers.get("Authorization"))
    except tombstoned.InvalidRequest as e:
        return HttpResponse(str(e), status=e.status, headers={"WWW-Authenticate": "Bearer"})


def payment_intent(request: HttpRequest) -> dict[str, Any]:
    """A refusal raised: the adapter answers its problem."""
    return parse_payment(request.body)


def create(tx: tombstoned.Transaction, payment: dict[str, Any]) -> tombstoned.Completed:
    row = Payment.objects.create(
        tenant_id=tx.scope.tenant,
        principal_id=tx.scope.principal,
        request_id=payment["request_id"],
        amount_minor=payment["amount_minor"],
    )
    tx.enqueue_event(str(row.payment_id), "payment.created", row.as_json())
    return tx.complete(201, row.as_json(), str(row.payment_id))


def create_then_fail(tx: tombstoned.Transaction, payment: dict[str, Any]) -> None:
    create(tx, payment)
    raise HandlerFailed("the handler failed after its business write")


def runner(lock_timeout: str, window: str = WINDOW) -> tombstoned.Idempotency:
    return tombstoned.django.idempotency(
        schema=SCHEMA, replay_window=window, lock_timeout=lock_timeout
    )


route: dict[str, Any] = dict(
    operation=OPERATION,
    caller=authenticate,
    intent=payment_intent,
    resource_url=payment_url,
    business_id=tombstoned.BusinessId(BUSINESS_CONSTRAINT, read_payment),
)
create_payment = idempotent(runner(PATIENT), **route)(create)
create_payment_impatient = idempotent(runner(IMPATIENT), **route)(create)
create_payment_brief = idempotent(runner(PATIENT, BRIEF_WINDOW), **route)(create)
create_payment_failing = idempotent(runner(PATIENT), **route)(create_then_fail)
create_payment_keyless = idempotent(runner(PATIENT), **route, key_optional=True)(create)
create_payment_elsewhere = idempotent(runner(PATIENT), **{**route, "operation": NOT_GRANTED})(
    create
)


def show_payment(request: HttpRequest, payment_id: uuid.UUID) -> HttpResponse:
    row = Payment.objects.filter(payment_id=payment_id).first()
    if row is None:
        return HttpResponse("no such payment", status=404)
    return JsonResponse(row.as_json())
