"""A stand-in for a vLLM server with sleep mode, which vLLM's CPU build lacks (`Platform.is_sleep_mode_available`),
so that the paired validation's order of calls can be checked on this machine: `POST /sleep`, `POST /wake_up` and
`GET /is_sleeping` as vLLM 0.24 answers them (vllm/entrypoints/serve/dev/sleep/api_router.py: a bare 200, 404 where
VLLM_SERVER_DEV_MODE is not set, 500 where the engine's call failed), a streaming `/v1/completions` while awake
(refused with 503 while asleep, so that a request to a sleeping engine shows as failed), `/health`, `/metrics`
(nothing running or waiting). Every sleep, wake-up and completion is appended to the --calls file with its time, a
JSON line each, readable once the server is stopped.

    python tests/sleep_server.py --port PORT --calls FILE [--refuse-sleep] [--fail-wake N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiohttp import web

from faulty_server import TOKEN_GAP_S, _chunk, _event


def make_app(calls: Path, refuse_sleep: bool, fail_wake: int | None) -> web.Application:
    state = {"asleep": False, "wakes": 0, "completions": 0}

    def note(call: str) -> None:
        with open(calls, "a") as f:
            f.write(json.dumps({"call": call, "at": time.time()}) + "\n")

    async def sleep(request: web.Request) -> web.Response:
        if refuse_sleep:  # as vLLM without VLLM_SERVER_DEV_MODE=1: the route is not there
            return web.json_response({"detail": "Not Found"}, status=404)
        note(f"sleep level {request.query.get('level', '1')}")
        state["asleep"] = True
        return web.Response()

    async def wake_up(_: web.Request) -> web.Response:
        state["wakes"] += 1
        if state["wakes"] == fail_wake:  # as a wake-up whose memory the GPU no longer has room for
            note("wake_up refused")
            return web.json_response({"error": {"message": "Call to wake_up method failed: CUDA out of memory"}},
                                     status=500)
        note("wake_up")
        state["asleep"] = False
        return web.Response()

    async def is_sleeping(_: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": state["asleep"]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if state["asleep"]:
            note("completion refused")
            return web.json_response({"error": {"message": "asleep"}}, status=503)
        note("completion")
        state["completions"] += 1
        n = int(body["max_tokens"])
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        request_id, created = f"cmpl-{state['completions']}", int(time.time())
        for i in range(n):
            await asyncio.sleep(TOKEN_GAP_S)
            await response.write(_chunk(request_id, created, "x", "length" if i == n - 1 else None))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": len(body["prompt"]) + n}
        await response.write(_event({"id": request_id, "object": "text_completion", "created": created,
                                     "model": "model", "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_running{engine="0"} 0.0\n'
                                 'vllm:num_requests_waiting{engine="0"} 0.0\n')

    app = web.Application()
    app.add_routes([web.post("/sleep", sleep), web.post("/wake_up", wake_up), web.get("/is_sleeping", is_sleeping),
                    web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/metrics", metrics)])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--calls", type=Path, required=True, help="Append each call here, a JSON line each.")
    parser.add_argument("--refuse-sleep", action="store_true", help="Answer POST /sleep with 404.")
    parser.add_argument("--fail-wake", type=int, help="Answer the N-th POST /wake_up with 500.")
    args = parser.parse_args()
    web.run_app(make_app(args.calls, args.refuse_sleep, args.fail_wake), host="127.0.0.1", port=args.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
