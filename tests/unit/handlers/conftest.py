"""Fixtures the handler tests share: a real aiohttp session (scrapes go to local test servers) and kopf's
posted events, captured."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.unit.handlers.fakeapi import PostedEvents, kopf_events


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def events() -> AsyncIterator[PostedEvents]:
    with kopf_events() as posted:
        yield posted
