"""Fixtures shared by test modules (a fixture imported from another module would shadow
itself in every test that takes it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.lookup_fakes import FakeLookupd


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeLookupd]]:
    """A list to put started fake lookupds in; all are stopped at the end."""
    started: list[FakeLookupd] = []
    yield started
    for f in started:
        await f.stop()
