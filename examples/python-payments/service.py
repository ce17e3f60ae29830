"""POST /payments with an Idempotency-Key, on tombstoned's SQL API: psycopg 3 and the standard
library's http.server. See examples/README.md for the contract the three examples share.

Environment:
  DATABASE_URL        the service role (USAGE on schema tombstoned, EXECUTE on its functions,
                      and its own table `payments`, examples/payments.sql)
  PAYMENTS_TOKENS     JSON: bearer token -> {"tenant": ..., "principal": ...}
  PORT                default 8080; 0 picks a free port. The first line printed names it.
  CLAIM_LOCK_TIMEOUT  how long a claim waits for an in-flight owner (default "2 seconds")
  REPLAY_WINDOW       how long a key replays its answer (default "24 hours")
"""

import json
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

OPERATION = "create-payment"
APPLICATION_NAME = "payments-python"
# ISO 4217 minor-unit exponents of the currencies this service takes.
CURRENCIES = {"EUR": 2, "USD": 2, "JPY": 0}
DEFAULT_CURRENCY = "EUR"
MAX_BODY_BYTES = 16 * 1024
ATTEMPTS = 3

DATABASE_URL = os.environ.get("DATABASE_URL", "")
TOKENS = json.loads(os.environ.get("PAYMENTS_TOKENS", "{}"))
LOCK_TIMEOUT = os.environ.get("CLAIM_LOCK_TIMEOUT", "2 seconds")
REPLAY_WINDOW = os.environ.get("REPLAY_WINDOW", "24 hours")

# Every statement takes its values as parameters.
CLAIM = """SELECT outcome, status_code, response_body, resource_id
  FROM tombstoned.claim(%s, %s, %s, %s, tombstoned.fingerprint(%s::jsonb),
                        %s::interval, %s::interval)"""
INSERT_PAYMENT = """INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES (%s, %s, %s, %s, %s, %s)
RETURNING p.payment_id::text, payment_body(p)::text"""
ENQUEUE = "SELECT tombstoned.enqueue_event(%s, %s, 'payment.created', %s::jsonb)"
COMPLETE = "SELECT tombstoned.complete(%s, %s, %s, %s, 201, %s::jsonb, %s)"
BY_REQUEST_ID = """SELECT p.principal_id = %s AND p.amount_minor = %s AND p.currency = %s
           AND p.payee = %s,
       payment_body(p)::text
  FROM payments AS p
 WHERE p.tenant_id = %s AND p.request_id = %s"""


class Invalid(Exception):
    """The request is refused before any transaction: its key is not consumed."""


class Again(Exception):
    """Run the whole transaction again (40001, 40P01, or a conflict that went away)."""


def answer(status, body, headers=None):
    return status, body, headers or {}


def problem(status, title, headers=None, **extra):
    return answer(status, json.dumps({"status": status, "title": title, **extra}), headers)


def in_progress():
    return problem(409, "a request with this Idempotency-Key is still in progress: "
                        "retry later with the same key", {"Retry-After": "1"})


def minor_units(amount, exponent):
    """"12.5" -> 1250 in a currency of exponent 2; a JSON number is not accepted."""
    match = isinstance(amount, str) and re.fullmatch(r"(0|[1-9][0-9]{0,11})(?:\.([0-9]+))?", amount)
    if not match or len(match.group(2) or "") > exponent:
        raise Invalid(f"amount: a decimal string with at most {exponent} decimals")
    minor = int(match.group(1)) * 10 ** exponent + int((match.group(2) or "").ljust(exponent, "0") or "0")
    if minor <= 0:
        raise Invalid("amount: must be positive")
    return minor


def text_field(doc, name, longest):
    value = doc.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= longest:
        raise Invalid(f"{name}: a string of 1 to {longest} characters")
    return value


def parse_intent(raw):
    """The normalised intent: defaults applied, the amount in minor units. Its fingerprint is
    tombstoned.fingerprint() of exactly this object."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Invalid("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise Invalid("the body must be a JSON object")
    currency = doc.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise Invalid("currency: one of " + ", ".join(sorted(CURRENCIES)))
    return {
        "v": 1,
        "request_id": text_field(doc, "request_id", 64),
        "amount_minor": minor_units(doc.get("amount"), CURRENCIES[currency]),
        "currency": currency,
        "payee": text_field(doc, "payee", 100),
    }


# --- README begin
def attempt(conn, tenant, principal, key, intent):
    """One READ COMMITTED transaction: claim, then act on the outcome."""
    stage = "claim"
    try:
        with conn.transaction():
            outcome, status, body, resource = conn.execute(CLAIM, (
                tenant, principal, OPERATION, key, json.dumps(intent),
                REPLAY_WINDOW, LOCK_TIMEOUT)).fetchone()
            if outcome == "owner":
                # Only the owner writes: the business row, its event, the answer.
                stage = "write"
                resource, created = conn.execute(INSERT_PAYMENT, (
                    tenant, principal, intent["request_id"], intent["amount_minor"],
                    intent["currency"], intent["payee"])).fetchone()
                conn.execute(ENQUEUE, (tenant, resource, created))
                (body,) = conn.execute(COMPLETE, (
                    tenant, principal, OPERATION, key, created, resource)).fetchone()
                status = 201
            stage = "commit"
        # Leaving the block committed, right after a replay's read too: the cleaner waits for
        # that share lock. No remote call happened inside.
    except psycopg.Error as e:
        if e.sqlstate == "55P03":          # the key's owner is still in flight
            return in_progress()
        if e.sqlstate == "23505" and e.diag.constraint_name == "payments_request_id_key":
            return by_request_id(conn, tenant, principal, intent)
        if e.sqlstate in ("40001", "40P01"):
            raise Again() from e
        if e.sqlstate == "25006":          # a read-only server: a standby, mid-failover
            return problem(503, "database read-only: retry with the same Idempotency-Key",
                           {"Retry-After": "1"})
        if stage == "commit" and (e.sqlstate is None or e.sqlstate.startswith("08")):
            return problem(503, "outcome unknown: retry with the same Idempotency-Key",
                           {"Retry-After": "1"})
        raise
    location = {"Location": f"/payments/{resource}"}
    if outcome == "owner":
        return answer(201, body, location)      # complete's text: what every replay sends
    if outcome == "replay":
        return answer(status, body, {**location, "Idempotent-Replayed": "true"})
    if outcome == "key_reused":
        return problem(422, "this Idempotency-Key was used for another request")
    if outcome == "expired":
        return problem(410, "beyond the replay window: look the payment up",
                       location, payment_id=resource)
    raise RuntimeError(f"unknown claim outcome {outcome!r}")
# --- README end


def by_request_id(conn, tenant, principal, intent):
    """The transaction rolled back on the business id: the request already has a payment,
    made under another key. The same caller's same request gets it as a replay; anything else
    is a conflict that says nothing of the other payment."""
    row = conn.execute(BY_REQUEST_ID, (
        principal, intent["amount_minor"], intent["currency"], intent["payee"],
        tenant, intent["request_id"])).fetchone()
    if row is None:
        raise Again()
    same, body = row
    if not same:
        return problem(409, "request_id already names another payment")
    return answer(201, body, {"Idempotent-Replayed": "true"})


def create_payment(tenant, principal, key, intent):
    with psycopg.connect(DATABASE_URL, autocommit=True,
                         application_name=APPLICATION_NAME) as conn:
        # The protocol's level, whatever the server's default is.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        for _ in range(ATTEMPTS):
            try:
                return attempt(conn, tenant, principal, key, intent)
            except Again:
                continue
    return problem(503, "busy: retry with the same Idempotency-Key", {"Retry-After": "1"})


def handle(method, path, headers, raw):
    if path != "/payments":
        return problem(404, "not found")
    if method != "POST":
        return problem(405, "method not allowed", {"Allow": "POST"})
    authorization = headers.get("Authorization", "")
    caller = TOKENS.get(authorization[7:]) if authorization.startswith("Bearer ") else None
    if caller is None:
        return problem(401, "unauthenticated", {"WWW-Authenticate": "Bearer"})
    key = headers.get("Idempotency-Key")
    if key is None or not 1 <= len(key) <= 255:
        return problem(400, "Idempotency-Key: a header of 1 to 255 characters")
    try:
        intent = parse_intent(raw)
    except Invalid as e:
        return problem(400, str(e))
    try:
        return create_payment(caller["tenant"], caller["principal"], key, intent)
    except psycopg.OperationalError:
        return problem(503, "database unavailable: retry with the same Idempotency-Key",
                       {"Retry-After": "1"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.serve()

    def do_GET(self):
        self.serve()

    def serve(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            status, body, headers = problem(413, f"the body must be at most {MAX_BODY_BYTES} bytes")
            self.close_connection = True
        else:
            raw = self.rfile.read(length)
            try:
                status, body, headers = handle(self.command, self.path, self.headers, raw)
            except Exception as e:  # a bug or an unexpected database error: logged, 500
                print(f"create payment failed: {e!r}", file=sys.stderr, flush=True)
                status, body, headers = problem(500, "internal error")
        data = body.encode("utf-8")
        self.send_response(status)
        content_type = "application/json" if status < 300 else "application/problem+json"
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def main():
    if not DATABASE_URL:
        sys.exit("DATABASE_URL is not set")
    for caller in TOKENS.values() if isinstance(TOKENS, dict) else [None]:
        if not (isinstance(caller, dict) and isinstance(caller.get("tenant"), str)
                and isinstance(caller.get("principal"), str)):
            sys.exit('PAYMENTS_TOKENS: {"token": {"tenant": ..., "principal": ...}, ...}')
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
