"""Signed trials: the statement and checkpoints a trial is signed with, checked with a public key alone.

Real trials (the CLI as a subprocess, or the API), real keys, real files; the
statement is also checked by the DSSE and in-toto reference implementations
(securesystemslib, in-toto-attestation), as any grader's tooling would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import marked, wait_until
from trialtool import Trial, UsageError, read_signing_key
from trialtool.ledger import verify
from trialtool.signing import dsse, generate, read_public_keys
from trialtool.signing import statement as statements

PY = sys.executable
UNSANDBOXED = {"sandbox": "none"}


def keygen(path: Path) -> Path:
    """A new key at `path`, made by the CLI; its public key written beside it as `path`.pub."""
    done = subprocess.run(
        [PY, "-m", "trialtool", "keygen", "-o", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    public = path.with_suffix(".pub")
    public.write_text(done.stdout)
    return public


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "trial.key"
    path.parent.mkdir()
    keygen(path)
    return path


class Signed:
    """A signed trial's files in `root`, called through the CLI."""

    def __init__(self, root: Path, key: Path, *flags: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.state, self.log = root / "s.json", root / "l.jsonl"
        self.statement = root / ("l.jsonl" + statements.SUFFIX)
        self.key = key
        self.flags = ["--state", str(self.state), "--log", str(self.log), "--signing-key", str(key), *flags]

    def call(self, *command: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", *self.flags, "--sandbox", "none", *flags, "--", *command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.root)

    def tool(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.root)

    def verify(self, public: Path, *extra: str) -> tuple[int, dict[str, Any]]:
        files = ["--state", str(self.state), "--log", str(self.log)]
        done = self.tool("verify", *files, "--public-key", str(public), "--json", *extra)
        return done.returncode, json.loads(done.stdout)


def ended(root: Path, key: Path, calls: int = 3) -> Signed:
    """A signed trial that spent its calls (its statement written then)."""
    trial = Signed(root, key, "--max-calls", str(calls))
    for number in range(calls):
        done = trial.call("echo", f"call {number}")
        assert done.returncode == 0, done.stderr
    assert trial.statement.exists()
    return trial


def test_keygen_writes_a_private_key_only_its_owner_reads_and_prints_its_public_key(tmp_path: Path) -> None:
    path = tmp_path / "k"
    public = keygen(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    (fingerprint,) = read_public_keys(str(public))
    assert read_signing_key(str(path)).fingerprint == fingerprint
    again = subprocess.run([PY, "-m", "trialtool", "keygen", "-o", str(path)], capture_output=True, text=True)
    assert again.returncode == 125 and "never replaced" in again.stderr
    assert read_signing_key(str(path)).fingerprint == fingerprint  # the key is as it was


def test_a_key_is_read_as_pem_raw_or_hex_and_openssls_own_is_taken(tmp_path: Path) -> None:
    made = generate(str(tmp_path / "made.pem"))
    seed = made._key.private_bytes_raw()
    (tmp_path / "raw").write_bytes(seed)
    (tmp_path / "hex").write_text(seed.hex() + "\n")
    for name in ("made.pem", "raw", "hex"):
        assert read_signing_key(str(tmp_path / name)).fingerprint == made.fingerprint
    openssl = shutil.which("openssl")
    if openssl is not None:
        subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(tmp_path / "o.pem")], check=True)
        subprocess.run(
            [openssl, "pkey", "-in", str(tmp_path / "o.pem"), "-pubout", "-out", str(tmp_path / "o.pub")], check=True
        )
        assert set(read_public_keys(str(tmp_path / "o.pub"))) == {read_signing_key(str(tmp_path / "o.pem")).fingerprint}
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(UsageError, match="holds no Ed25519 key"):
        read_signing_key(str(tmp_path / "junk"))


def test_a_trial_ends_signed_and_its_statement_verifies_with_the_public_key(tmp_path: Path, key: Path) -> None:
    trial = ended(tmp_path / "t", key)
    assert trial.call("echo", "one too many").returncode == 123  # refused: covered by its checkpoint
    code, report = trial.verify(key.with_suffix(".pub"))
    assert code == 0 and report["verdict"] == "clean", report
    signed = report["signature"]
    assert signed["status"] == "statement" and signed["signed_records"] == report["records"] == 5
    assert signed["signer"] == read_signing_key(str(key)).fingerprint
    envelope = json.loads(trial.statement.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    body = json.loads(base64.b64decode(envelope["payload"]))
    assert signed["statement_sha256"] == hashlib.sha256(base64.b64decode(envelope["payload"])).hexdigest()
    predicate = body["predicate"]
    assert body["subject"][0]["name"] == "l.jsonl" and body["subject"][0]["annotations"]["bytes"] < os.path.getsize(
        trial.log
    )
    assert predicate["ended_by"] == "maximum_tool_calls" and predicate["signed_on"] == "budget_spent"
    assert predicate["totals"] == {"charged_calls": 3, "emitted_tokens": 12, "refused_calls": 0}
    assert predicate["verdict"] == "clean" and predicate["rules"]["limits"]["max_calls"] == 3
    assert predicate["rules"]["tokenizer"]["encoding"] == "o200k_base"


def test_the_reference_dsse_and_in_toto_tooling_verifies_the_statement(tmp_path: Path, key: Path) -> None:
    from google.protobuf import json_format
    from in_toto_attestation.v1.statement import Statement
    from in_toto_attestation.v1.statement_pb2 import Statement as StatementMessage
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    trial = ended(tmp_path / "t", key)
    (public,) = read_public_keys(str(key.with_suffix(".pub"))).values()
    trusted = SSlibKey(public.fingerprint, "ed25519", "ed25519", {"public": public.raw.hex()})
    envelope = Envelope.from_dict(json.loads(trial.statement.read_text()))
    assert set(envelope.verify([trusted], 1)) == {public.fingerprint}
    message = json_format.Parse(envelope.payload, StatementMessage())
    Statement.copy_from_pb(message).validate()
    assert (
        message.subject[0].digest["sha256"]
        == hashlib.sha256(trial.log.read_bytes()[: int(message.subject[0].annotations["bytes"])]).hexdigest()
    )
    # Another key, by the reference's own check too.
    other = generate(str(tmp_path / "other.key"))
    stranger = SSlibKey(public.fingerprint, "ed25519", "ed25519", {"public": other.public.raw.hex()})
    from securesystemslib.exceptions import VerificationError

    with pytest.raises(VerificationError):
        envelope.verify([stranger], 1)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One ended signed trial, made once: (its directory, the public key)."""
    root = tmp_path_factory.mktemp("signed")
    (root / "t").mkdir()
    key = root / "trial.key"
    public = keygen(key)
    with Trial(root / "t" / "s.json", root / "t" / "l.jsonl", limits={**UNSANDBOXED, "max_calls": 4},
               signing_key=read_signing_key(str(key))) as trial:  # fmt: skip
        for word in ("alpha", "beta", "gamma", "delta"):
            trial.run(["echo", word], cwd=str(root))
    return root / "t", public


def _copy(made: tuple[Path, Path], into: Path) -> Path:
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(made[0], into)
    return into


def _verdict(directory: Path, public: Path) -> str:
    return verify.verify(directory / "s.json", directory / "l.jsonl", trusted=read_public_keys(str(public))).verdict


def test_the_made_trial_is_clean_under_its_key(made: tuple[Path, Path]) -> None:
    assert _verdict(made[0], made[1]) == "clean"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), what=st.sampled_from(["log", "payload", "signature"]))
def test_one_byte_changed_anywhere_fails(made: tuple[Path, Path], tmp_path: Path, where: float, what: str) -> None:
    copy = _copy(made, tmp_path / "copy")
    statement = copy / ("l.jsonl" + statements.SUFFIX)
    if what == "log":
        data = bytearray((copy / "l.jsonl").read_bytes())
        at = int(where * len(data))
        data[at] ^= 0x01 if data[at] != 0x0A else 0x20  # another byte; a newline becomes a space
        (copy / "l.jsonl").write_bytes(bytes(data))
    else:
        envelope = json.loads(statement.read_text())
        field = "payload" if what == "payload" else "sig"
        holder = envelope if what == "payload" else envelope["signatures"][0]
        raw = bytearray(base64.b64decode(holder[field]))
        raw[int(where * len(raw))] ^= 0x01
        holder[field] = base64.b64encode(bytes(raw)).decode()
        statement.write_text(json.dumps(envelope))
    assert _verdict(copy, made[1]) in ("failed", "signature_invalid")


def test_the_envelopes_text_changed_fails(made: tuple[Path, Path], tmp_path: Path) -> None:
    copy = _copy(made, tmp_path / "copy")
    statement = copy / ("l.jsonl" + statements.SUFFIX)
    text = statement.read_text()
    for old, new in (('"payloadType": "application/vnd.in-toto+json"', '"payloadType": "application/json"'),
                     ('"payload": "', '"payload": "A')):  # fmt: skip
        statement.write_text(text.replace(old, new, 1))
        assert _verdict(copy, made[1]) == "signature_invalid"


def test_a_statement_signed_by_another_key_fails(made: tuple[Path, Path], tmp_path: Path) -> None:
    copy = _copy(made, tmp_path / "copy")
    other = generate(str(tmp_path / "other.key"))
    other_public = tmp_path / "other.pub"
    other_public.write_text(other.public.pem())
    # The trial's own statement, checked against a key that did not sign it.
    assert _verdict(copy, other_public) == "signature_invalid"
    # A statement re-signed by someone else's key (the same content): the trial's key does not accept it.
    statement = copy / ("l.jsonl" + statements.SUFFIX)
    envelope = json.loads(statement.read_text())
    payload = base64.b64decode(envelope["payload"])
    statement.write_text(json.dumps(dsse.seal(payload, statements.PAYLOAD_TYPE, other)))
    assert _verdict(copy, made[1]) == "signature_invalid"


def test_a_log_swapped_for_another_trials_fails(made: tuple[Path, Path], tmp_path: Path) -> None:
    one = _copy(made, tmp_path / "one")
    (tmp_path / "two").mkdir()
    key = read_signing_key(str(made[0].parent / "trial.key"))
    with Trial(tmp_path / "two" / "s.json", tmp_path / "two" / "l.jsonl", limits={**UNSANDBOXED, "max_calls": 4},
               signing_key=key) as trial:  # fmt: skip
        for word in ("alpha", "beta", "gamma", "delta"):
            trial.run(["echo", word], cwd=str(tmp_path))
    for name in ("s.json", "l.jsonl"):
        shutil.copy(tmp_path / "two" / name, one / name)  # two's files, one's statement
    assert _verdict(one, made[1]) == "signature_invalid"


def test_a_trial_killed_mid_run_verifies_up_to_its_last_checkpoint(tmp_path: Path, key: Path, marker: str) -> None:
    trial = Signed(tmp_path / "t", key, "--checkpoint-every", "4")
    for number in range(5):
        assert trial.call("echo", str(number)).returncode == 0
    # A sixth call, killed (trial-tool and all) while its command runs: no statement, no record of it.
    sleeper = [PY, "-c", "import time; time.sleep(60)", marker]  # the marker fixture reaps it whatever happens
    argv = [PY, "-m", "trialtool", *trial.flags, "--sandbox", "none", "--in-process", "--", *sleeper]
    running = subprocess.Popen(argv, cwd=trial.root, start_new_session=True)
    try:
        assert wait_until(lambda: len(json.loads(trial.state.read_text())["in_flight"]) == 1)
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    code, report = trial.verify(key.with_suffix(".pub"))
    assert not trial.statement.exists()
    assert code == 7 and report["verdict"] == "unsigned", report
    assert report["records"] == 6 and report["signature"]["signed_records"] == 4
    assert "records 5 to 6 are not signed" in report["signature"]["why"]
    assert report["in_flight"] == [{"sequence": 6, "owner": "gone"}]
    # The next call records the killed one (and stops what it left running), its checkpoint covering all again.
    assert trial.call("true").returncode == 0
    assert wait_until(lambda: not marked(marker))
    code, report = trial.verify(key.with_suffix(".pub"))
    assert report["signature"]["signed_records"] == 8 and report["records"] == 8, report


def test_a_record_the_state_has_not_counted_is_unsigned_until_the_next_call(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    assert trial.call("echo", "one").returncode == 0
    before = trial.state.read_bytes()
    assert trial.call("echo", "two").returncode == 0
    trial.state.write_bytes(before)  # what a crash between the record and the state leaves
    code, report = trial.verify(key.with_suffix(".pub"))
    assert report["verdict"] == "unsigned" and report["signature"]["signed_records"] == 2 and code == 7
    assert trial.call("echo", "three").returncode == 0  # rolled forward, then signed
    code, report = trial.verify(key.with_suffix(".pub"))
    assert code == 0 and report["signature"]["status"] == "checkpoint" and report["signature"]["signed_records"] == 4


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.integers(1, 6), every=st.integers(1, 4))
def test_checkpoints_cover_every_whole_multiple_of_their_cadence(
    tmp_path_factory: pytest.TempPathFactory, calls: int, every: int
) -> None:
    root = tmp_path_factory.mktemp("cadence")
    key = generate(str(root / "k"))
    (root / "k.pub").write_text(key.public.pem())
    with Trial(root / "s.json", root / "l.jsonl", limits=UNSANDBOXED, signing_key=key,
               checkpoint_every=every) as trial:  # fmt: skip
        for _ in range(calls):
            trial.run(["true"], cwd=str(root))
        found = verify.verify(root / "s.json", root / "l.jsonl", trusted=read_public_keys(str(root / "k.pub")))
        records = 1 + calls  # the trial's first record, then a record a call
        assert found.signatures is not None and found.signatures.signed_records == every * (records // every)
        assert found.verdict == ("clean" if records % every == 0 else "unsigned")
    # close() signed the statement, which covers all of it.
    found = verify.verify(root / "s.json", root / "l.jsonl", trusted=read_public_keys(str(root / "k.pub")))
    assert found.verdict == "clean" and found.signatures is not None and found.signatures.status == "statement"
    assert trial.attestation is not None and trial.attestation.sha256 == found.signatures.statement_sha256


def test_a_signed_trial_is_written_only_with_its_own_key(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    assert trial.call("true").returncode == 0
    before = {path.name: path.read_bytes() for path in trial.root.iterdir() if path.is_file()}
    files = ["--state", str(trial.state), "--log", str(trial.log), "--sandbox", "none"]
    unsigned = trial.tool(*files, "--", "true")
    assert unsigned.returncode == 125 and "is signed" in unsigned.stderr
    other = tmp_path / "keys" / "other.key"
    keygen(other)
    wrong = trial.tool(*files, "--signing-key", str(other), "--", "true")
    assert wrong.returncode == 125 and "is signed by key" in wrong.stderr
    changed = trial.tool(*files, "--signing-key", str(key), "--checkpoint-every", "9", "--", "true")
    assert changed.returncode == 125 and "--checkpoint-every" in changed.stderr
    after = {path.name: path.read_bytes() for path in trial.root.iterdir() if path.is_file()}
    assert before == after
    plain = Signed(tmp_path / "plain", key)
    plain.flags = plain.flags[:4]
    assert plain.call("true").returncode == 0
    late = plain.call("true", flags=("--signing-key", str(key)))
    assert late.returncode == 125 and "made without a signing key" in late.stderr
    ledger_key = tmp_path / "ledger.key"
    ledger_key.write_text("k" * 32)
    both = Signed(tmp_path / "both", key, "--key-file", str(ledger_key)).call("true")
    assert both.returncode == 125 and "not both" in both.stderr


def test_the_environment_names_the_key_and_it_must_be_absolute(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    trial.flags = trial.flags[:4]
    env = {**os.environ, "TRIALTOOL_SIGNING_KEY": str(key)}
    argv = [
        PY,
        "-m",
        "trialtool",
        *trial.flags,
        "--sandbox",
        "none",
        "--",
        "sh",
        "-c",
        "echo ${TRIALTOOL_SIGNING_KEY:-none}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=trial.root, timeout=60)
    assert done.returncode == 0 and done.stdout == "none\n", done.stderr  # never passed to the command
    assert json.loads(trial.state.read_text())["signing"]["signer"] == read_signing_key(str(key)).fingerprint
    env["TRIALTOOL_SIGNING_KEY"] = "keys/trial.key"
    relative = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert relative.returncode == 125 and "absolute" in relative.stderr


def test_attest_and_close_sign_the_statement_now(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    assert trial.call("echo", "one").returncode == 0
    assert not trial.statement.exists()
    files = ["--state", str(trial.state), "--log", str(trial.log), "--signing-key", str(key)]
    done = trial.tool("attest", *files, "--json")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["records"] == 2 and made["statement"] == str(trial.statement)
    code, report = trial.verify(key.with_suffix(".pub"))
    assert code == 0 and report["signature"]["statement_sha256"] == made["statement_sha256"]
    predicate = json.loads(base64.b64decode(json.loads(trial.statement.read_text())["payload"]))["predicate"]
    assert predicate["signed_on"] == "attest" and predicate["ended_by"] is None
    assert trial.call("echo", "two").returncode == 0
    closed = trial.tool("close", *files)
    assert closed.returncode == 0 and "signed 3 records" in closed.stdout, closed.stderr
    without = trial.tool("attest", "--state", str(trial.state), "--log", str(trial.log))
    assert without.returncode == 125 and "signing key" in without.stderr


def test_a_tampered_trial_is_not_signed(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    assert trial.call("echo", "one").returncode == 0
    log = trial.log.read_bytes()
    trial.log.write_bytes(log.replace(b'"status":"ok"', b'"status":"error"'))
    assert trial.log.read_bytes() != log
    files = ["--state", str(trial.state), "--log", str(trial.log), "--signing-key", str(key)]
    done = trial.tool("attest", *files)
    assert done.returncode == 125 and not trial.statement.exists()


def test_without_a_public_key_nothing_is_said_of_signatures_and_an_unsigned_trial_is_unsigned(
    tmp_path: Path, key: Path
) -> None:
    trial = ended(tmp_path / "t", key)
    files = ["--state", str(trial.state), "--log", str(trial.log)]
    done = trial.tool("verify", *files, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["signature"] is None
    plain = Signed(tmp_path / "plain", key)
    plain.flags = plain.flags[:4]
    assert plain.call("true").returncode == 0
    code, report = plain.verify(key.with_suffix(".pub"))
    assert code == 7 and report["verdict"] == "unsigned"
    assert "without a signing key" in report["signature"]["why"]


def test_report_and_export_over_signed_and_unsigned_trials(tmp_path: Path, key: Path) -> None:
    ended(tmp_path / "trials" / "a", key)
    ended(tmp_path / "trials" / "b", key)
    plain = Signed(tmp_path / "trials" / "c", key)
    plain.flags = plain.flags[:4]
    assert plain.call("true").returncode == 0
    public = key.with_suffix(".pub")
    trials = str(tmp_path / "trials")
    done = plain.tool("report", trials, "--format", "json", "--public-key", str(public))
    assert done.returncode == 7, done.stderr
    overview = json.loads(done.stdout)
    assert overview["overview"]["integrity"] == {"clean": 2, "unsigned": 1}
    without = plain.tool("report", trials, "--format", "json")
    assert without.returncode == 0
    table = tmp_path / "trials.jsonl"
    calls = str(tmp_path / "calls.jsonl")
    exported = plain.tool("export", trials, "--public-key", str(public), "--trials", str(table), "-o", calls)
    assert exported.returncode == 0, exported.stderr
    rows = {Path(row["state"]).parent.name: row for row in map(json.loads, table.read_text().splitlines())}
    fingerprint = read_signing_key(str(key)).fingerprint
    assert rows["a"]["signature"] == rows["b"]["signature"] == "statement"
    assert rows["a"]["signer"] == fingerprint and rows["a"]["statement_sha256"]
    assert rows["c"]["signature"] == "unsigned" and rows["c"]["signer"] is None
    # A file of several trusted keys: the trial's among others.
    other = generate(str(tmp_path / "other.key"))
    several = tmp_path / "trusted.pub"
    several.write_text(other.public.pem() + public.read_text())
    again = plain.tool("report", str(tmp_path / "trials" / "a"), "--format", "json", "--public-key", str(several))
    assert again.returncode == 0, again.stdout


def test_an_unsigned_call_loads_nothing_of_the_signing_room(tmp_path: Path) -> None:
    from trialtool import signing
    from trialtool.doors import fromflags

    assert fromflags.SIGNING_KEY_ENV == signing.SIGNING_KEY_ENV
    script = (
        "import sys, trialtool.doors.cli as cli\n"
        "flags = ['--state', 's.json', '--log', 'l.jsonl', '--sandbox', 'none', '--in-process']\n"
        "code = cli.main([*flags, '--', 'true'])\n"
        "print(code, sorted(name for name in sys.modules if name.startswith(('trialtool.signing', 'cryptography'))))\n"
    )
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.stdout.split(" ", 1) == ["0", "[]\n"], done.stderr


def test_pae_is_the_dsse_specifications_and_both_base64_alphabets_are_read(tmp_path: Path) -> None:
    # The DSSE specification's own example.
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    key = generate(str(tmp_path / "k"))
    payload = bytes(range(256)) * 3  # base64 of this has both + and /
    envelope = dsse.seal(payload, "application/x-test", key)
    urlsafe = {
        **envelope,
        "payload": str(envelope["payload"]).replace("+", "-").replace("/", "_"),
    }
    trusted = {key.fingerprint: key.public}
    for form in (envelope, urlsafe):
        opened = dsse.open_envelope(form, "application/x-test", trusted)
        assert opened == (payload, key.fingerprint)
    with pytest.raises(dsse.BadEnvelope, match="payloadType"):
        dsse.open_envelope(envelope, "application/vnd.in-toto+json", trusted)


def test_a_statements_write_cut_short_leaves_nothing_after_the_next(tmp_path: Path, key: Path) -> None:
    trial = Signed(tmp_path / "t", key)
    assert trial.call("true").returncode == 0
    dead = subprocess.Popen(["true"])  # a process that has ended: its pid is a dead writer's
    dead.wait()
    left = trial.root / f".l.jsonl{statements.SUFFIX}.{dead.pid}.0badc0de.tmp"
    left.write_text("half a statement")
    files = ["--state", str(trial.state), "--log", str(trial.log), "--signing-key", str(key)]
    assert trial.tool("attest", *files).returncode == 0
    assert not left.exists() and trial.statement.exists()


def test_a_key_file_read_again_is_parsed_again_only_once_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "k"
    first = generate(str(path))
    read = read_signing_key(str(path))
    assert read is read_signing_key(str(path)) and read.fingerprint == first.fingerprint
    other = generate(str(tmp_path / "other"))
    os.replace(tmp_path / "other", path)  # another key in its place
    assert read_signing_key(str(path)).fingerprint == other.fingerprint
    path.write_bytes(first._key.private_bytes_raw())  # rewritten in place
    assert read_signing_key(str(path)).fingerprint == first.fingerprint
