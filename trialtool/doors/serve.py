"""`trial-tool serve`: one warm trial-tool speaking JSON lines over stdin and stdout.

A harness in any language starts it once per trial and writes one request a
line; the answer to each is one line with the same `id`. Messages have the
shape of JSON-RPC 2.0 (`id`, `method`, `params`; `result` or `error` with
`code`, `message` and `data`), so existing JSON-RPC code can speak it, but the
`"jsonrpc": "2.0"` member is optional in requests. Methods: `run`, `budget`,
`ping`. The README has the full protocol and an example session.

Why not a thread per line: requests run on a pool of `max_concurrent`
threads, and reading stops while all are busy, so a client that floods the
server is slowed down rather than buffered without bound. The protocol stream
is a private duplicate of the original stdout; descriptor 1 itself is pointed
at stderr, so nothing else in this process (a stray print, a library's
warning) can write into the protocol. Commands never could: their output goes
to pipes and their stdin is /dev/null or a pipe of their own (`input`).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import ERROR_CODE, TrialToolError
from ..osio import write_all
from ..process import Cancellation
from ..trial import Trial
from ..types import CallRequest

#: JSON-RPC 2.0 error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
#: A TrialToolError: `data.kind` names it, `data.exit_code` is what the CLI would exit with.
TRIAL_TOOL_ERROR = ERROR_CODE

DEFAULT_MAX_CONCURRENT = 4
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
_RUN_PARAMS = frozenset({"command", "cwd", "env", "timeout", "input", "input_b64", "merge_output"})


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_object(exc: BaseException) -> dict[str, object]:
    """The JSON-RPC error member for `exc`."""
    if isinstance(exc, _BadRequest):
        return {"code": exc.code, "message": exc.message}
    if isinstance(exc, TrialToolError):
        return exc.as_json()
    return {"code": INTERNAL_ERROR, "message": f"{type(exc).__name__}: {exc}"}


def call_request(params: dict[str, object]) -> CallRequest:
    """The call a `run` request's params ask for, checked (the JSON types here, the values by CallRequest)."""
    unknown = set(params) - _RUN_PARAMS
    if unknown:
        raise _BadRequest(INVALID_PARAMS, f"unknown params: {', '.join(sorted(unknown))}")
    command = params.get("command")
    if not (isinstance(command, str) or (isinstance(command, list) and all(isinstance(a, str) for a in command))):
        raise _BadRequest(INVALID_PARAMS, "params.command must be a string (run by /bin/sh -c) or a list of strings")
    cwd = params.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _BadRequest(INVALID_PARAMS, "params.cwd must be a string")
    env = params.get("env")
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise _BadRequest(INVALID_PARAMS, "params.env must be an object of strings")
    timeout = params.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise _BadRequest(INVALID_PARAMS, "params.timeout must be a number of seconds")
    merge_output = params.get("merge_output", False)
    if not isinstance(merge_output, bool):
        raise _BadRequest(INVALID_PARAMS, "params.merge_output must be true or false")
    return CallRequest.of(command, cwd=cwd, env=env, timeout=timeout, input=_input(params), merge_output=merge_output)


def _input(params: dict[str, object]) -> bytes | str | None:
    """The command's stdin: `input` (text, sent as UTF-8) or `input_b64` (any bytes), not both."""
    text, encoded = params.get("input"), params.get("input_b64")
    if text is not None and encoded is not None:
        raise _BadRequest(INVALID_PARAMS, "give params.input or params.input_b64, not both")
    if text is not None and not isinstance(text, str):
        raise _BadRequest(INVALID_PARAMS, "params.input must be a string (params.input_b64 for bytes)")
    if encoded is None:
        return text
    import binascii

    try:
        if not isinstance(encoded, str):
            raise ValueError(encoded)
        return binascii.a2b_base64(encoded.encode("ascii"), strict_mode=True)
    except (ValueError, binascii.Error):
        raise _BadRequest(INVALID_PARAMS, "params.input_b64 must be base64") from None


class JsonLinesServer:
    """Serve one trial over a pair of descriptors until EOF or a signal."""

    def __init__(
        self,
        trial: Trial,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.trial = trial
        self.max_concurrent = max_concurrent
        self.max_request_bytes = max_request_bytes
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._write_lock = threading.Lock()
        self._out_fd = -1
        self._client_gone = False
        # Calls stopped by a signal to the server are still answered: their text is delivered.
        self._stop = Cancellation("trial-tool serve was told to stop", delivers=True)

    # -- output ----------------------------------------------------------------

    def _send(self, message: dict[str, object]) -> None:
        line = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False).encode() + b"\n"
        with self._write_lock:
            if self._client_gone:
                return
            try:
                write_all(self._out_fd, line)
            except BrokenPipeError:
                # The client went away; calls still run to their end and are recorded.
                self._client_gone = True

    # -- requests --------------------------------------------------------------

    def _handle(self, line: bytes) -> tuple[Any, str, dict[str, object]] | None:
        """Parse one line; answer it at once if it is bad, else return (id, method, params)."""
        try:
            request = json.loads(line)
        except ValueError as exc:
            self._send({"id": None, "error": {"code": PARSE_ERROR, "message": f"not JSON: {exc}"}})
            return None
        if not isinstance(request, dict):
            self._send({"id": None, "error": {"code": INVALID_REQUEST, "message": "a request is a JSON object"}})
            return None
        ident = request.get("id")
        if isinstance(ident, dict | list):
            self._send({"id": None, "error": {"code": INVALID_REQUEST, "message": "id must be a string or number"}})
            return None
        method = request.get("method")
        params = request.get("params", {})
        if params is None:
            params = {}
        if not isinstance(method, str) or not isinstance(params, dict):
            message = "a request needs a string method and object params"
            self._send({"id": ident, "error": {"code": INVALID_REQUEST, "message": message}})
            return None
        if method not in ("run", "budget", "ping"):
            message = f"no method {method!r}: run, budget, ping"
            self._send({"id": ident, "error": {"code": METHOD_NOT_FOUND, "message": message}})
            return None
        return ident, method, params

    def _execute(self, ident: Any, method: str, params: dict[str, object]) -> None:
        try:
            if method == "run":
                result = self.trial.call(call_request(params), interrupt=self._stop)
                answer: dict[str, object] = {"id": ident, "result": result.as_json()}
            elif method == "budget":
                answer = {"id": ident, "result": self.trial.budget().as_json()}
            else:
                answer = {"id": ident, "result": {}}
        except Exception as exc:  # every failure is an answer; the server goes on
            answer = {"id": ident, "error": error_object(exc)}
        finally:
            self._slots.release()
        self._send(answer)

    # -- the loop --------------------------------------------------------------

    def serve(self, in_fd: int, out_fd: int) -> int:
        """Read requests from `in_fd`, answer on `out_fd`; 0 at EOF, 128+N after signal N."""
        self._out_fd = out_fd
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        received: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            if not received:
                # Stop what runs; each call is still recorded and answered.
                self._stop.reason = f"trial-tool serve received {signal.Signals(signum).name}"
                self._stop.cancel()
            received.append(signum)

        previous_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        pool = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="trialtool-serve")
        pending: set[Future[None]] = set()
        try:
            for line in self._lines(in_fd, wake_r, received):
                parsed = self._handle(line)
                if parsed is None:
                    continue
                # Wait for a free slot: reading stops while every worker is busy. A signal
                # meanwhile stops the running calls, which frees one.
                self._slots.acquire()
                if received:
                    self._slots.release()
                    break
                future = pool.submit(self._execute, *parsed)
                pending.add(future)
                future.add_done_callback(pending.discard)
        finally:
            pool.shutdown(wait=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wake_r)
            os.close(wake_w)
            self._stop.close()
        return 128 + received[0] if received else 0

    def _lines(self, in_fd: int, wake_fd: int, received: list[int]) -> Iterator[bytes]:
        """Yield request lines; answer oversized ones here. Ends at EOF or on a signal."""
        buffer = bytearray()
        discarding = False  # inside an oversized line: drop until its newline
        limit = self.max_request_bytes
        with selectors.DefaultSelector() as selector:
            selector.register(in_fd, selectors.EVENT_READ)
            selector.register(wake_fd, selectors.EVENT_READ)
            while not received:
                ready = {key.fd for key, _ in selector.select()}
                if in_fd not in ready:
                    continue
                chunk = os.read(in_fd, 65536)
                if not chunk:
                    break
                buffer += chunk
                while True:
                    cut = buffer.find(b"\n")
                    if cut < 0:
                        if len(buffer) > limit and not discarding:
                            self._too_large()
                            discarding = True
                        if discarding:
                            buffer.clear()
                        break
                    line = bytes(buffer[:cut])
                    del buffer[: cut + 1]
                    if discarding:
                        discarding = False
                    elif len(line) > limit:
                        self._too_large()
                    elif line.strip():
                        yield line
            # EOF in the middle of a line: a complete request without its newline is served.
            if not received and not discarding and buffer.strip():
                yield bytes(buffer)

    def _too_large(self) -> None:
        message = f"request longer than {self.max_request_bytes} bytes (--max-request-bytes); skipped"
        self._send({"id": None, "error": {"code": INVALID_REQUEST, "message": message}})


def run(trial: Trial, *, max_concurrent: int, max_request_bytes: int) -> int:
    """The `trial-tool serve` process: protect stdout, serve stdin, return the exit code."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything else written to fd 1 now lands on stderr, not in the protocol
    try:
        server = JsonLinesServer(trial, max_concurrent=max_concurrent, max_request_bytes=max_request_bytes)
        return server.serve(0, out_fd)
    finally:
        trial.close()
        os.close(out_fd)


__all__ = ["JsonLinesServer", "call_request", "error_object", "run"]
