"""Schemathesis hooks for .ci/schemathesis: a fresh Idempotency-Key for every generated POST.

Generated cases reuse a handful of header values; a key reused with another body is correctly
refused (422 idempotency-key-reused, docs/api.md), so with the generated keys almost no case would
reach order creation. Every *valid* key is replaced by a unique one; invalid keys (negative
testing) are left as generated, so the 400 answers are still exercised. Likewise a valid
`request_id` is made unique (generated ones repeat, which answers 409 duplicate-request-id or 200
for most cases); invalid ones are kept.
"""

import re
import uuid

import schemathesis

VALID_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.operation.method.upper() != "POST" or not case.headers:
        return
    for name in list(case.headers):
        if name.lower() == "idempotency-key":
            value = case.headers[name]
            if isinstance(value, str) and VALID_KEY.match(value):
                case.headers[name] = f"st-{uuid.uuid4()}"
    body = case.body
    if isinstance(body, dict):
        request_id = body.get("request_id")
        if isinstance(request_id, str) and 0 < len(request_id) <= 200 and not CONTROL.search(request_id):
            body["request_id"] = f"{request_id}-{uuid.uuid4()}"
