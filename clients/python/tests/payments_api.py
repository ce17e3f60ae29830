"""What the two test apps (FastAPI, Django) share: who the callers are, how a request body
becomes the normalised intent, and the routes each app serves with the same contract:

- ``POST /payments``: create (lock_timeout 10 s: a second request waits for the first);
- ``POST /payments/impatient``: the same operation, lock_timeout 200 ms (409 while held);
- ``POST /payments/brief``: the same operation, a replay window of 1 second (the stress run);
- ``POST /payments/failing``: inserts, then raises (nothing may commit);
- ``POST /payments/keyless``: the key optional;
- ``POST /payments/elsewhere``: an operation the service role was not granted (42501);
- ``GET /payments/{payment_id}``: where Location leads.
"""

from __future__ import annotations

import json
from typing import Any

import tombstoned

OPERATION = "create-payment"
TOKENS = {
    "tok-billing": tombstoned.Caller("acme", "billing"),
    "tok-audit": tombstoned.Caller("acme", "audit"),
}
#: The lock_timeout of each route's runner, and the replay windows.
PATIENT, IMPATIENT = "10 seconds", "200 milliseconds"
WINDOW, BRIEF_WINDOW = "1 hour", "1 second"


class HandlerFailed(Exception):
    """What the failing route's handler raises after its business write (each app answers it
    with a 500 of its own)."""


def caller_of(authorization: str | None) -> tombstoned.Caller:
    token = authorization[7:] if authorization and authorization.startswith("Bearer ") else ""
    caller = TOKENS.get(token)
    if caller is None:
        raise tombstoned.InvalidRequest(
            "unauthenticated",
            status=401,
            problem="unauthenticated",
            title="A valid bearer token is required",
        )
    return caller


def parse_payment(raw: bytes) -> dict[str, Any]:
    """``{"request_id": str, "amount_minor": positive int, ...}`` -> the normalised intent
    (other fields are not part of it), or InvalidRequest (a 400 problem)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise tombstoned.InvalidRequest("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise tombstoned.InvalidRequest("the body must be an object")
    request_id, amount = doc.get("request_id"), doc.get("amount_minor")
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= 64:
        raise tombstoned.InvalidRequest("request_id: 1 to 64 characters")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise tombstoned.InvalidRequest("amount_minor: a positive integer")
    return {"v": 1, "request_id": request_id, "amount_minor": amount, "currency": "EUR"}


def payment_url(payment_id: str) -> str:
    return f"/payments/{payment_id}"


def body_of(payment_id: str, request_id: str, amount_minor: int) -> dict[str, Any]:
    """A payment's representation (py_payment_body() in SQL says the same)."""
    return {
        "payment_id": payment_id,
        "request_id": request_id,
        "amount_minor": amount_minor,
        "status": "created",
    }
