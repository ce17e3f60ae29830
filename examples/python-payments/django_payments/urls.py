"""The app's routes."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("payments", views.create_payment),
    path("payments/<uuid:payment_id>", views.show_payment),
]
