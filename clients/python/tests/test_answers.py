"""answer() against clients/answers.json, case by case (the Node client's tests read the same
file, so the two cannot drift); the errors of the SQLSTATE cases are made by the real server
(RAISE ... USING ERRCODE) and classified; the Idempotency-Key header's rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

import tombstoned
from support import REPO, SERVICE_URL

CASES = json.loads((REPO / "clients" / "answers.json").read_text())
URL = "/payments/pay-1"
PREFIX = CASES["problem_type_prefix"]
STORED = '{"payment_id": "pay-1", "status": "created"}'
NOW = datetime.now(timezone.utc)


def resource_url(resource_id: str) -> str:
    return f"/payments/{resource_id}"


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        yield conn


def raised(conn: psycopg.Connection[Any], sqlstate: str) -> tombstoned.TombstonedError:
    """The server's error of ``sqlstate``, classified."""
    with pytest.raises(psycopg.Error) as error:
        conn.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'made by the test' USING ERRCODE = '{sqlstate}'; END $$"
        )
    assert error.value.sqlstate == sqlstate
    mapped = tombstoned.classify(error.value)
    assert mapped is not None, sqlstate
    return mapped


def inputs(
    conn: psycopg.Connection[Any], case: dict[str, Any]
) -> list[tombstoned.Result | tombstoned.TombstonedError]:
    """What gives this case's answer (one per SQLSTATE the case lists)."""
    name = case["case"]
    fixed: dict[str, tombstoned.Result | tombstoned.TombstonedError] = {
        "owner_completed": tombstoned.Completed(201, STORED, "pay-1", NOW),
        "replay": tombstoned.Replay(201, STORED, "pay-1", NOW),
        "replay_by_business_id": tombstoned.ReplayByBusinessId(200, STORED, "pay-1"),
        "key_reused": tombstoned.KeyReused(),
        "expired": tombstoned.Expired("pay-1", NOW, NOW),
        "duplicate_business_id": tombstoned.DuplicateBusinessId(),
        "outcome_unknown": _outcome_unknown(),
    }
    if name in fixed:
        return [fixed[name]]
    if name == "missing_or_invalid_key":
        with pytest.raises(tombstoned.InvalidIdempotencyKey) as invalid:
            tombstoned.read_idempotency_key([])
        return [invalid.value]
    if name == "retries_exhausted":
        made = [raised(conn, s) for s in case["sqlstate"]]
        assert all(isinstance(e, tombstoned.SerializationFailure) for e in made)
        return [*made, *(tombstoned.RetriesExhausted(3, sqlstate=e.sqlstate) for e in made)]
    if "sqlstate_class" in case:
        representative = {"08": "08006", "53": "53300"}[case["sqlstate_class"]]
        return [raised(conn, representative)]
    return [raised(conn, case["sqlstate"])]


def _outcome_unknown() -> tombstoned.TombstonedError:
    mapped = tombstoned.classify(
        psycopg.OperationalError("server closed the connection"), at_commit=True
    )
    assert isinstance(mapped, tombstoned.OutcomeUnknown)
    return mapped


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda case: case["case"])
def test_answers_are_the_shared_table(conn: psycopg.Connection[Any], case: dict[str, Any]) -> None:
    for given in inputs(conn, case):
        reply = tombstoned.http_answer(given, resource_url=resource_url)
        status = 201 if case["status"] == "stored" else case["status"]
        assert reply.status == status, given
        problem = "problem" in case
        expected = {
            "Content-Type": "application/problem+json" if problem else "application/json",
            **{k: URL if v == "resource_url" else v for k, v in case["headers"].items()},
        }
        assert reply.headers == expected, given
        if not problem:
            assert reply.body == STORED
            continue
        document = json.loads(reply.body)
        assert document["type"] == CASES["problem_type_prefix"] + case["problem"]
        assert (document["title"], document["status"]) == (case["title"], status)
        assert isinstance(document["detail"], str) and document["detail"]
        members = {
            k: v for k, v in document.items() if k not in ("type", "title", "status", "detail")
        }
        assert sorted(members) == sorted(case.get("members", [])), given
        if members:
            assert members == {"resource_id": "pay-1", "resource_url": URL}


def test_without_a_resource_url_there_is_no_location() -> None:
    expired = tombstoned.http_answer(tombstoned.Expired("pay-1", NOW, None))
    assert "Location" not in expired.headers
    assert json.loads(expired.body)["resource_id"] == "pay-1"
    completed = tombstoned.Completed(201, STORED, "pay-1", NOW)
    assert "Location" not in tombstoned.http_answer(completed).headers


def test_a_resource_name_names_the_410s_members_as_the_endpoint_does() -> None:
    """The endpoint's 410 says order_id and order_url; a payment's, payment_id and payment_url."""
    reply = tombstoned.http_answer(
        tombstoned.Expired("pay-1", NOW, None), resource_url=resource_url, resource_name="payment"
    )
    document = json.loads(reply.body)
    assert (document["payment_id"], document["payment_url"]) == ("pay-1", URL)
    assert "resource_id" not in document and "resource_url" not in document


def test_an_invalid_request_is_its_problem() -> None:
    refused = tombstoned.InvalidRequest(
        "amount: a decimal string",
        status=401,
        problem="unauthenticated",
        title="A valid bearer token is required",
        members={"field": "amount"},
        headers={"WWW-Authenticate": "Bearer"},
    )
    reply = tombstoned.http_answer(refused)
    assert reply.status == 401
    assert reply.headers == {
        "Content-Type": "application/problem+json",
        "WWW-Authenticate": "Bearer",
    }
    assert json.loads(reply.body) == {
        "type": CASES["problem_type_prefix"] + "unauthenticated",
        "title": "A valid bearer token is required",
        "status": 401,
        "detail": "amount: a decimal string",
        "field": "amount",
    }
    default = json.loads(tombstoned.http_answer(tombstoned.InvalidRequest("no")).body)
    assert (default["status"], default["type"]) == (400, PREFIX + "validation-failed")


def test_an_error_that_is_not_the_protocols_is_a_500_that_says_nothing_of_it() -> None:
    error = tombstoned.NotAllowed('role "svc" may not use operation "x"', sqlstate="42501")
    reply = tombstoned.http_answer(error)
    assert (reply.status, json.loads(reply.body)["detail"]) == (500, "Internal error.")
    assert "svc" not in reply.body and "42501" not in reply.body


@pytest.mark.parametrize(
    "values",
    [[], [""], ["a" * 256], ["has space"], ["caf\u00e9"], ["tab\tkey"], ["k-1", "k-1"], ["\x7f"]],
    ids=["missing", "empty", "256", "space", "non-ascii", "control", "twice", "del"],
)
def test_invalid_idempotency_keys(values: list[str]) -> None:
    with pytest.raises(tombstoned.InvalidIdempotencyKey):
        tombstoned.read_idempotency_key(values)


def test_valid_idempotency_keys() -> None:
    for key in ["a", "~" * 255, "7d1c-pay-1", "!#$%&'*+,-./:;<=>?@[]^_`{|}"]:
        assert tombstoned.read_idempotency_key([key]) == key
    assert tombstoned.read_idempotency_key([], key_optional=True) is None
    with pytest.raises(tombstoned.InvalidIdempotencyKey):
        tombstoned.read_idempotency_key([""], key_optional=True)
