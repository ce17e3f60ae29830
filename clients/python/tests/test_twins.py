"""The sync twins are what tools/async_to_sync.py makes of their asyncio sources, as committed
(edit the asyncio file, run the tool)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "async_to_sync.py"


def test_the_sync_twins_are_generated_from_the_asyncio_sources() -> None:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules["async_to_sync"] = tool
    spec.loader.exec_module(tool)
    for path, text in tool.generated().items():
        assert path.read_text() == text, f"{path.name} differs: run {TOOL.name}"
