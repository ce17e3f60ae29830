"""The payment row (examples/payments.sql makes the table: Django does not manage it)."""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

from django.db import connection, models


class Payment(models.Model):
    payment_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    tenant_id = models.TextField()
    principal_id = models.TextField()
    request_id = models.TextField()
    amount_minor = models.BigIntegerField()
    currency = models.TextField()
    payee = models.TextField()
    # Declared, so that a type checker set up for another app's settings knows it too.
    objects: ClassVar[models.Manager[Payment]] = models.Manager()

    class Meta:
        managed = False
        db_table = "payments"

    def body_text(self) -> str:
        """payment_body(p) as jsonb's text: the one place a payment's JSON is built (its
        created_at is the database's), so every answer about it is the same."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT payment_body(p)::text FROM payments AS p WHERE p.payment_id = %s",
                [self.payment_id],
            )
            (text,) = cursor.fetchone() or ("null",)
        return str(text)

    def as_json(self) -> Any:
        return json.loads(self.body_text())
