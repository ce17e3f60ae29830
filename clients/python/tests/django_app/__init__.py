"""The Django test app (payments_api.py lists its routes): the business write is ORM code, in
the claim's transaction, on Django's own connection; the views run under ATOMIC_REQUESTS, from
which idempotent() exempts its own."""
