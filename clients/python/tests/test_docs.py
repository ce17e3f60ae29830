"""Every Python sample of this package's README, and of the top-level README's section "Use the
protocol from your own service", is either run here (`<!-- run -->` before it; its output is the
```text block after it) or quoted verbatim from a file the tests run (`<!-- quoted: PATH -->`,
PATH from the README's directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from psycopg import sql

from support import PATIENCE, REPO, SCHEMA, SERVICE_ROLE, SERVICE_URL, admin

PACKAGE = Path(__file__).resolve().parents[1]
FENCE = re.compile(
    r"^(?:<!-- (?P<marker>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```\n", re.M | re.S
)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Block:
    readme: Path
    marker: str | None
    lang: str
    body: str
    output: str | None  # the ```text block right after it


def blocks(readme: Path, section: str | None = None) -> list[Block]:
    text = readme.read_text()
    if section is not None:
        text = text.split(section, 1)[1].split("\n## ", 1)[0]
    found = list(FENCE.finditer(text))
    out = []
    for i, match in enumerate(found):
        if match["lang"] != "python":
            continue
        after = found[i + 1] if i + 1 < len(found) else None
        output = None
        if (
            after is not None
            and after["lang"] == "text"
            and text[match.end() : after.start()].strip() == ""
        ):
            output = after["body"]
        out.append(Block(readme, match["marker"], match["lang"], match["body"], output))
    return out


SAMPLES = blocks(PACKAGE / "README.md") + blocks(
    REPO / "README.md", "## Use the protocol from your own service"
)


def test_every_sample_is_run_or_quoted() -> None:
    assert len(SAMPLES) >= 4
    for block in SAMPLES:
        assert block.marker == "run" or (block.marker or "").startswith("quoted: "), (
            f"{block.readme.name}: a python sample without <!-- run --> or <!-- quoted: -->:\n"
            f"{block.body}"
        )


@pytest.mark.parametrize(
    "block",
    [b for b in SAMPLES if (b.marker or "").startswith("quoted: ")],
    ids=lambda b: b.body[:30],
)
def test_quoted_samples_are_verbatim(block: Block) -> None:
    source = block.readme.parent / (block.marker or "").removeprefix("quoted: ")
    assert block.body in source.read_text(), f"not verbatim in {source}:\n{block.body}"


@pytest.fixture(scope="module")
def payments_table() -> None:
    """The examples' business table (examples/payments.sql), the service role's own."""
    assert SCHEMA == "tombstoned", "the samples use the default schema"
    with admin() as conn:
        conn.execute((REPO / "examples" / "payments.sql").read_text().encode())
        conn.execute(
            sql.SQL(
                "ALTER TABLE payments OWNER TO {r};"
                " ALTER FUNCTION payment_body(payments) OWNER TO {r}"
            ).format(r=sql.Identifier(SERVICE_ROLE))
        )


@pytest.mark.parametrize(
    "block", [b for b in SAMPLES if b.marker == "run"], ids=lambda b: b.body[:30]
)
def test_run_samples_print_what_the_readme_shows(block: Block, payments_table: None) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block.body],
        env={**os.environ, "DATABASE_URL": SERVICE_URL, "PYTHONPATH": str(PACKAGE / "src")},
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert done.returncode == 0, done.stderr
    if block.output is not None:
        assert UUID.sub("<uuid>", done.stdout) == UUID.sub("<uuid>", block.output)
