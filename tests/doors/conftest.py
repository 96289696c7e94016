"""What the per-user server's tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import stop_servers


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's own server directory; every server in it is stopped afterwards."""
    directory = tmp_path / "servers"
    monkeypatch.setenv("TRIALTOOL_SERVER_DIR", str(directory))
    monkeypatch.setenv("TRIALTOOL_SERVER", "on")
    yield directory
    stop_servers(directory)
