"""o200k_base offline: exact equality with tiktoken, no network, hash checks, overrides."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TrialFiles, minimal_env
from trialtool.errors import EncoderError
from trialtool.output import tokens


@pytest.fixture(scope="module")
def tiktoken_reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tiktoken's own get_encoding("o200k_base"), from a cache seeded with the same file."""
    import tiktoken

    cache = tmp_path_factory.mktemp("tiktoken-cache")
    shutil.copyfile(tokens.locate(), cache / Path(tokens.tiktoken_cache_path()).name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        return tiktoken.get_encoding("o200k_base")


def test_encoder_is_tiktokens_o200k_base(encoder: Any, tiktoken_reference: Any) -> None:
    assert encoder.name == "o200k_base"
    assert encoder._pat_str == tiktoken_reference._pat_str
    assert encoder._special_tokens == tiktoken_reference._special_tokens
    assert encoder._mergeable_ranks == tiktoken_reference._mergeable_ranks
    assert encoder.n_vocab == tiktoken_reference.n_vocab


@settings(max_examples=300, deadline=None)
@given(text=st.text() | st.binary().map(lambda b: b.decode("utf-8", "replace")))
def test_counts_equal_tiktoken(encoder: Any, tiktoken_reference: Any, text: str) -> None:
    assert encoder.encode_ordinary(text) == tiktoken_reference.encode_ordinary(text)


def test_official_ranks_are_in_order() -> None:
    # tokens.RankFile.encoder counts ranks instead of parsing them; this is why it may.
    fields = Path(tokens.locate()).read_bytes().split()
    assert [int(rank) for rank in fields[1::2]] == list(range(len(fields) // 2))


def test_wrong_hash_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "o200k_base.tiktoken"
    bad.write_bytes(Path(tokens.locate()).read_bytes()[:-10])
    with pytest.raises(EncoderError, match="expected 446a9538"):
        tokens.RankFile(bad)


def test_tiktoken_cache_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = tokens.locate()
    monkeypatch.setattr(tokens, "_BUNDLED", tmp_path / "missing")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(EncoderError, match=r"bundled copy .* is missing"):
        tokens.locate()
    cached = (
        tmp_path / hashlib.sha1(b"https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken").hexdigest()
    )
    shutil.copyfile(bundled, cached)
    assert Path(tokens.locate()) == cached
    tokens.RankFile(str(cached))  # and it passes the hash check


NO_NETWORK = textwrap.dedent(
    """
    import os, sys
    def hook(event, args):
        if event.startswith("socket.") or event.startswith("urllib."):
            sys.stderr.write(f"NETWORK USED: {event}\\n")
            os._exit(99)
    sys.addaudithook(hook)
    from trialtool.doors.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_no_network_is_touched(trial: TrialFiles, tmp_path: Path) -> None:
    empty_cache = tmp_path / "empty-cache"
    empty_cache.mkdir()
    # In process: the audit hook watches the process that builds the encoder.
    env = minimal_env(TIKTOKEN_CACHE_DIR=str(empty_cache), HOME=str(tmp_path), TRIALTOOL_SERVER="off")
    argv = [
        sys.executable,
        "-c",
        NO_NETWORK,
        "--state",
        str(trial.state),
        "--log",
        str(trial.log),
        "--",
        "echo",
        "héllo wörld",
    ]
    done = subprocess.run(argv, capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "héllo wörld\n".encode()
    assert trial.records()[0]["delivered_emitted_tokens"] > 0


def test_the_hook_would_catch_a_download(tmp_path: Path) -> None:
    # Proof that the test above can fail: tiktoken's own loader, with no cache, reaches for the network.
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    code = NO_NETWORK.replace(
        "from trialtool.doors.cli import main\nsys.exit(main(sys.argv[1:]))",
        "import tiktoken; tiktoken.get_encoding('o200k_base')",
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert done.returncode == 99 and b"NETWORK USED" in done.stderr


def test_a_seeded_cache_serves_tiktoken_offline(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = tokens.seed_tiktoken_cache(cache)
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == tokens.EXPECTED_SHA256
    assert tokens.seed_tiktoken_cache(cache) == path  # kept as it is
    # tiktoken's own loader, under the hook that fails on any network use (the test above shows it would).
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": str(cache), "HOME": str(tmp_path)}
    code = NO_NETWORK.replace(
        "from trialtool.doors.cli import main\nsys.exit(main(sys.argv[1:]))",
        "import tiktoken; print(tiktoken.get_encoding('o200k_base').encode('hello world'))",
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"[24912, 2375]\n"), done.stderr


@pytest.mark.parametrize("how", ["env", "flag"])
def test_bad_rank_file_fails_before_charging(trial: TrialFiles, tmp_path: Path, how: str) -> None:
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"not the ranks\n")
    if how == "env":
        done = trial.call("echo", "hi", env=minimal_env(**{tokens.RANK_FILE_ENV: str(bad)}))
    else:
        done = trial.call("echo", "hi", flags=("--o200k-file", str(bad)))
    assert done.returncode == 125
    message = done.stderr.decode()
    assert message.count("\n") == 1 and "sha256" in message and "o200k-file" in message
    assert not trial.state.exists() and not trial.log.exists()


def test_missing_rank_file_fails_before_charging(trial: TrialFiles, tmp_path: Path) -> None:
    assert trial.call("true").returncode == 0
    before = trial.snapshot()
    done = trial.call("echo", "hi", flags=("--o200k-file", str(tmp_path / "nowhere")))
    assert done.returncode == 125 and b"does not exist" in done.stderr
    assert trial.snapshot() == before


def test_good_override_is_used(trial: TrialFiles, tmp_path: Path) -> None:
    copy = tmp_path / "copy.tiktoken"
    shutil.copyfile(tokens.locate(), copy)
    done = trial.call("echo", "hi", flags=("--o200k-file", str(copy)))
    assert done.returncode == 0 and done.stdout == b"hi\n"


def test_encoder_is_built_only_for_output(trial: TrialFiles) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from trialtool import Trial
        t = Trial({str(trial.state)!r}, {str(trial.log)!r})
        t.run(["true"])
        print("tiktoken" in sys.modules)
        t.run(["echo", "x"])
        print("tiktoken" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr
