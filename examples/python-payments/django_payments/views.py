"""POST /payments on the client's Django adapter; GET /payments/{id}, where Location leads."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET, require_POST

import business
import tombstoned
import tombstoned.django
from tombstoned.django import idempotent

from .models import Payment

payments = tombstoned.django.idempotency(
    replay_window=business.REPLAY_WINDOW, lock_timeout=business.LOCK_TIMEOUT
)


def authenticate(request: HttpRequest) -> tombstoned.Caller:
    return business.caller_of(request.headers.get("Authorization"))


def payment_intent(request: HttpRequest) -> dict[str, Any]:
    return business.parse_intent(request.body)


def by_request_id(
    conn: psycopg.Connection[Any], scope: tombstoned.Scope, intent: dict[str, Any]
) -> tombstoned.BusinessRecord | None:
    """The payment that holds the request_id, read when the INSERT met 23505 under a new key."""
    row = conn.execute(
        business.BY_REQUEST_ID, business.by_request_id_params(scope, intent)
    ).fetchone()
    return business.business_record(row)


# --- README begin
@require_POST
@idempotent(
    payments,
    operation=business.OPERATION,
    caller=authenticate,
    intent=payment_intent,
    resource_url=business.payment_url,
    resource_name="payment",
    business_id=tombstoned.BusinessId(business.REQUEST_ID_CONSTRAINT, by_request_id),
)
def create_payment(tx: tombstoned.Transaction, intent: dict[str, Any]) -> tombstoned.Completed:
    """Only the key's owner gets here: the ORM's INSERT runs in the claim's transaction, and
    the payment, its event and the answer commit together, or none of them does."""
    payment = Payment.objects.create(
        tenant_id=tx.scope.tenant,
        principal_id=tx.scope.principal,
        request_id=intent["request_id"],
        amount_minor=intent["amount_minor"],
        currency=intent["currency"],
        payee=intent["payee"],
    )
    body = payment.as_json()
    tx.enqueue_event(str(payment.payment_id), "payment.created", body)
    return tx.complete(201, body, str(payment.payment_id))


# --- README end


@require_GET
def show_payment(request: HttpRequest, payment_id: uuid.UUID) -> HttpResponse:
    try:
        caller = authenticate(request)
        payment = Payment.objects.filter(tenant_id=caller.tenant, payment_id=payment_id).first()
        text = payment.body_text() if payment else None
    except Exception as e:
        refused = tombstoned.classify(e)  # a refusal, or 503 + Retry-After from the database
        if refused is None:
            raise
        return response(tombstoned.http_answer(refused))
    if text is None:
        return response(tombstoned.http_answer(business.not_found("payment")))
    return HttpResponse(text, content_type="application/json")


def response(answer: tombstoned.HttpAnswer) -> HttpResponse:
    return HttpResponse(answer.body, status=answer.status, headers=answer.headers)
