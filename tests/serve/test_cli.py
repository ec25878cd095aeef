"""`context-assembler serve` as an operator starts it: a real process on a free port."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.factories import EXAMPLES

JSON = {"Content-Type": "application/json"}  # urllib would declare a form


def start_serve(*options: str) -> tuple[subprocess.Popen[str], int]:
    """`serve --port 0 OPTIONS` and the port its banner names."""
    process = subprocess.Popen([sys.executable, "-m", "context_assembler.cli", "serve", "--port", "0",
                                *options], stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    banner = process.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/v1/assemble", banner)
    assert found, banner
    return process, int(found.group(1))


def test_serve_answers_then_stops_on_sigterm() -> None:
    process, port = start_serve("--max-event-bytes", "100000")
    try:
        assert process.stderr is not None
        url = f"http://127.0.0.1:{port}/v1/assemble"
        good = (EXAMPLES / "events.jsonl").read_bytes().splitlines()[0]
        with urllib.request.urlopen(urllib.request.Request(url, data=good, headers=JSON)) as response:
            assert response.status == 200
            assert b'"request_id":"q30-staff"' in response.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, data=b" " * 100_001, headers=JSON))
        assert refused.value.code == 413
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        logged = [json.loads(line) for line in process.stderr.read().splitlines()]
        assert [(entry["level"], entry["reason"]) for entry in logged] == [("WARNING", "limits")]
    finally:
        process.kill()
        process.wait()


def test_serve_refuses_a_bad_policy_before_listening() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "context_assembler.cli", "serve", "--port", "0", "--policy", "no-such"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "no-such" in done.stderr


@pytest.mark.parametrize(
    ("option", "says"),
    [(["--port", "70000"], "ASSEMBLER_SERVE_PORT (--port): Input should be less than or equal to 65535"),
     (["--port", "-5"], "ASSEMBLER_SERVE_PORT (--port): Input should be greater than or equal to 0"),
     (["--port", "http"], "ASSEMBLER_SERVE_PORT (--port): Input should be a valid integer"),
     (["--body-timeout", "0"], "ASSEMBLER_BODY_TIMEOUT_SECONDS (--body-timeout): Input should be greater than 0"),
     (["--idle-timeout", "nan"], "ASSEMBLER_IDLE_TIMEOUT_SECONDS (--idle-timeout): Input should be a finite number")],
)
def test_serve_refuses_an_option_out_of_range_as_a_usage_error(option: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "context_assembler.cli", "serve", *option],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert says in done.stderr
    assert done.stdout == ""


def test_serve_answers_408_to_a_body_slower_than_its_body_timeout() -> None:
    process, port = start_serve("--body-timeout", "0.5")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: 100\r\n\r\n{")
            assert connection.recv(4096).split()[1] == b"408"
    finally:
        process.kill()
        process.wait()
