"""What every integration test shares."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def collect_the_frameworks_leftovers() -> Iterator[None]:
    """Collect what a framework left unclosed (inspect's anyio streams) now, not in some later test.

    Garbage in a reference cycle is freed whenever the collector next runs, and its
    ResourceWarning, an error under this suite's filters, would fail whichever
    test happened to be running then.
    """
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
