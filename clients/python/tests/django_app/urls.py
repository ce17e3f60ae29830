"""The Django test app's routes (payments_api.py)."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("payments", views.create_payment),
    path("payments/impatient", views.create_payment_impatient),
    path("payments/brief", views.create_payment_brief),
    path("payments/failing", views.create_payment_failing),
    path("payments/keyless", views.create_payment_keyless),
    path("payments/elsewhere", views.create_payment_elsewhere),
    path("payments/<uuid:payment_id>", views.show_payment),
]
