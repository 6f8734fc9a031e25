"""A real HTTP server speaking vLLM's streaming /v1/completions, which misbehaves on purpose, request by request.

Each request's fault is drawn from a seeded generator keyed by the request's body, so a replay of the same
trace meets the same faults whatever order its requests arrive in; the server writes down what it did to
each request (`GET /ledger`) for the replay's records to be checked against.

    python tests/faulty_server.py --port PORT --seed SEED --stall-s SECONDS
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import socket
import struct
import time
from http import HTTPStatus

from aiohttp import web

# The fault names, each one way a server can fail a streaming request.
OK = "ok"  # every token, usage, [DONE]
SHORT = "short"  # finishes normally (finish_reason "stop") with half the tokens
STATUS_400 = "status_400"  # refuses the request, as vLLM refuses one longer than its context
STATUS_429 = "status_429"
STATUS_500 = "status_500"
STATUS_503 = "status_503"
ERROR_EVENT = "error_event"  # half the tokens, then vLLM's in-stream error event and [DONE]
MALFORMED_EVENT = "malformed_event"  # an SSE data line that is not JSON, among otherwise good events
CLOSED_MIDSTREAM = "closed_midstream"  # a 200 whose body ends cleanly half-way, without [DONE]
RESET_MIDSTREAM = "reset_midstream"  # half the tokens, then a TCP reset
RESET_BEFORE_RESPONSE = "reset_before_response"  # the request is read, then a TCP reset, no status line
EMPTY_BODY = "empty_body"  # 200 with an empty body
STALLED = "stalled"  # one token, then silence for longer than any client waits

FAULTS = (OK, SHORT, STATUS_400, STATUS_429, STATUS_500, STATUS_503, ERROR_EVENT, MALFORMED_EVENT,
          CLOSED_MIDSTREAM, RESET_MIDSTREAM, RESET_BEFORE_RESPONSE, EMPTY_BODY, STALLED)
STATUS_OF = {STATUS_400: 400, STATUS_429: 429, STATUS_500: 500, STATUS_503: 503}
TOKEN_GAP_S = 0.002


def fault_for(body: bytes, seed: int) -> str:
    """The fault a request meets: the same body and seed always meet the same one."""
    return random.Random(f"{seed}:{hashlib.sha256(body).hexdigest()}").choice(FAULTS)


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _chunk(request_id: str, created: int, text: str, finish_reason: str | None) -> bytes:
    """A token event as vLLM writes it."""
    return _event({"id": request_id, "object": "text_completion", "created": created, "model": "model",
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                                "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]})


def _error(status: int) -> dict:
    """An error as vLLM's server writes one, as a body or as an in-stream event."""
    return {"error": {"message": f"injected {status}", "type": HTTPStatus(status).phrase, "param": None,
                      "code": status}}


def _reset(request: web.Request) -> None:
    """Close the connection with a TCP reset (linger 0) rather than an orderly shutdown."""
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.transport.abort()


def make_app(seed: int, stall_s: float) -> web.Application:
    ledger: list[dict] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        fault = fault_for(raw, seed)
        ledger.append({"sha256": hashlib.sha256(raw).hexdigest(), "fault": fault})
        n = int(body["max_tokens"])
        if fault in STATUS_OF:
            return web.json_response(_error(STATUS_OF[fault]), status=STATUS_OF[fault])
        if fault == RESET_BEFORE_RESPONSE:
            _reset(request)
            return web.Response()  # never written: the connection is gone
        if fault == EMPTY_BODY:
            return web.Response(status=200, body=b"", content_type="text/event-stream")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        request_id, created = f"cmpl-{ledger[-1]['sha256'][:16]}", int(time.time())
        sent = {OK: n, MALFORMED_EVENT: n, STALLED: 1}.get(fault, max(1, n // 2))
        try:
            for i in range(sent):
                await asyncio.sleep(TOKEN_GAP_S)
                last = i == sent - 1
                finish = ("length" if fault in (OK, MALFORMED_EVENT) else "stop" if fault == SHORT else None)
                await response.write(_chunk(request_id, created, "x", finish if last else None))
                if fault == MALFORMED_EVENT and i == sent // 2:
                    await response.write(b'data: {"id":"' + request_id.encode() + b'","choices":[{"text":\n\n')
            if fault == STALLED:
                await asyncio.sleep(stall_s)
            elif fault == RESET_MIDSTREAM:
                _reset(request)
                return response
            elif fault == ERROR_EVENT:
                await response.write(_event(_error(500)))
            elif fault in (OK, SHORT, MALFORMED_EVENT):
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": sent,
                         "total_tokens": len(body["prompt"]) + sent}
                await response.write(_event({"id": request_id, "object": "text_completion", "created": created,
                                             "model": "model", "choices": [], "usage": usage}))
            if fault != CLOSED_MIDSTREAM:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            pass  # the client gave up first (a stalled stream past its timeout)
        return response

    async def ledger_view(_: web.Request) -> web.Response:
        return web.json_response(ledger)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{engine="0"} 0.0\n')

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/ledger", ledger_view),
                    web.get("/health", health), web.get("/metrics", metrics)])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--stall-s", type=float, required=True, help="How long a stalled stream stays silent.")
    args = parser.parse_args()
    web.run_app(make_app(args.seed, args.stall_s), host="127.0.0.1", port=args.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
