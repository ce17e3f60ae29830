"""The business table (support.BUSINESS_TABLE made it; Django does not manage it)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models

from payments_api import body_of


class Payment(models.Model):
    payment_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    tenant_id = models.TextField()
    principal_id = models.TextField()
    request_id = models.TextField()
    amount_minor = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        managed = False
        db_table = "py_payments"

    def as_json(self) -> dict[str, Any]:
        return body_of(str(self.payment_id), self.request_id, self.amount_minor)
