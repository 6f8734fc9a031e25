"""A minimal OpenAI-style streaming server: the fixed point against which the replayer itself is measured.

It streams `max_tokens` chunks `gap_ms` apart with no model behind them, so any lateness or latency seen
against it belongs to the client. A path prefix makes it misbehave on purpose, for the replayer's outcome
tests (`POST /drop/v1/completions`); `/v1/completions` behaves:
  ok        stream every token, then usage and [DONE]
  error     answer 500 at once
  midstream send half the tokens, then an error event
  drop      send half the tokens, then close the connection without [DONE]
  short     finish normally with half the tokens (finish_reason "stop")
  stall     send one token, then nothing (for client timeouts)
"""

from __future__ import annotations

import argparse
import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


BEHAVIOURS = ("ok", "error", "midstream", "drop", "short", "stall")


def make_app(gap_ms: float = 0.0) -> Starlette:
    async def completions(request: Request):
        behaviour = request.path_params.get("behaviour", "ok")
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        if behaviour == "error":
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)

        async def events():
            sent = n if behaviour == "ok" else (1 if behaviour == "stall" else max(1, n // 2))
            for i in range(sent):
                if gap_ms:
                    await asyncio.sleep(gap_ms / 1000)
                last = i == sent - 1 and behaviour in ("ok", "short")
                chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": ("length" if behaviour == "ok"
                                                                                else "stop") if last else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            if behaviour == "stall":
                await asyncio.sleep(3600)
            if behaviour == "midstream":
                yield 'data: {"error": {"message": "injected mid-stream failure"}}\n\n'
                return
            if behaviour == "drop":
                raise ConnectionResetError("injected drop")  # uvicorn closes the connection mid-body
            usage = {"prompt_tokens": len(body.get("prompt", [])), "completion_tokens": sent,
                     "total_tokens": len(body.get("prompt", [])) + sent}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(_: Request):
        return PlainTextResponse("")

    async def metrics(_: Request):
        return PlainTextResponse("vllm:num_requests_running{engine=\"0\"} 0.0\n")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/{behaviour}/v1/completions", completions, methods=["POST"]),
                            Route("/health", health), Route("/metrics", metrics)])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    args = parser.parse_args()
    uvicorn.run(make_app(args.gap_ms), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
