"""A provider API of the test's own on 127.0.0.1: it records each request and answers a
canned, valid response, so the official SDKs can be run as written with no network. The
canned answers cite the first passage (search result 0, document "wp-2-periods") as the
providers cite: examples/event.json's first label."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_RESPONSE: dict[str, Any] = {
    "id": "msg_loopback", "type": "message", "role": "assistant", "model": "claude-test",
    "content": [{"type": "text", "text": "A pump is covered for three years.", "citations": [
        {"type": "search_result_location", "search_result_index": 0,
         "source": "policies/warranty-policy.md", "title": None,
         "cited_text": "pump: 3 years", "start_block_index": 0, "end_block_index": 1}]}],
    "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
COHERE_RESPONSE: dict[str, Any] = {
    "id": "chat-loopback", "finish_reason": "COMPLETE",
    "message": {"role": "assistant",
                "content": [{"type": "text", "text": "A pump is covered for three years."}],
                "citations": [{"start": 2, "end": 6, "text": "pump", "type": "TEXT_CONTENT",
                               "sources": [{"type": "document", "id": "wp-2-periods",
                                            "document": {"id": "wp-2-periods"}}]}]},
    "usage": {"billed_units": {"input_tokens": 1, "output_tokens": 1},
              "tokens": {"input_tokens": 1, "output_tokens": 1}},
}
OPENAI_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-loopback", "object": "chat.completion", "created": 0, "model": "gpt-test",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                 "message": {"role": "assistant", "content": "Three years."}}],
}
# By the path each SDK posts to (base_url + its path).
RESPONSES: dict[str, dict[str, Any]] = {
    "/v1/messages": ANTHROPIC_RESPONSE,
    "/v2/chat": COHERE_RESPONSE,
    "/chat/completions": OPENAI_RESPONSE,
}


@dataclass
class Recorded:
    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Loopback:
    url: str
    requests: list[Recorded] = field(default_factory=list)


@contextmanager
def provider_server() -> Iterator[Loopback]:
    """A server on an ephemeral port of 127.0.0.1 for the block's duration."""
    loopback = Loopback(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            path = self.path.split("?")[0]
            loopback.requests.append(Recorded("POST", path, body))
            answer = RESPONSES.get(path)
            payload = json.dumps(answer or {"message": f"no such path {path}"}).encode()
            self.send_response(200 if answer else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    loopback.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield loopback
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
