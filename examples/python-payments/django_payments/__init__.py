"""The Django sample app of "create payment" (django_service.py serves it): the same service as
service.py, on the client's Django adapter, its payment row written by the ORM inside the
claim's transaction."""
