"""The replayer against a minimal local streaming server that misbehaves on purpose (a real vLLM server
cannot be made to answer 500s or cut a stream on demand): every request ends with its outcome recorded, the
replayer never crashes, and sends stay on schedule whatever is in flight."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest

from conftest import REPO
from tuner.traces.records import Trace, TraceRequest
from tuner.workers.launch import free_port
from tuner.workers.prompts import PromptBuilder
from tuner.workers.replay import Stop, prepare_requests, replay, send_completion
from tuner.workers.request_record import Outcome, RequestRecord


@pytest.fixture(scope="module")
def minimal_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "minimal_server.py"), "--port", str(port),
                             "--gap-ms", "2"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def _trace(n: int, gap_s: float = 0.0, output: int = 8) -> Trace:
    requests = tuple(TraceRequest(i * gap_s, 16, output) for i in range(n))
    return Trace("synthetic", "native", "0" * 64, requests)


@pytest.mark.parametrize("behaviour, outcome", [
    ("", Outcome.OK),
    ("error", Outcome.HTTP_ERROR),
    ("midstream", Outcome.HTTP_ERROR),
    ("drop", Outcome.DISCONNECTED),
    ("short", Outcome.TRUNCATED),
])
def test_each_server_behaviour_is_recorded_as_its_outcome(minimal_server, behaviour, outcome):
    base = f"{minimal_server}/{behaviour}" if behaviour else minimal_server
    result = asyncio.run(replay(base, prepare_requests(_trace(4), 1024, "model"), collect_metrics=False))
    assert [r.outcome for r in result.records] == [outcome] * 4
    for r in result.records:
        if outcome is Outcome.OK:
            assert r.output_tokens == r.requested_tokens == 8 and r.error is None
            assert 0 < r.ttft_s <= r.e2e_s and r.itl_mean_s > 0
        elif outcome is Outcome.TRUNCATED:
            assert r.output_tokens == 4 and r.e2e_s is not None
        else:
            assert r.error and r.e2e_s is None
    if outcome is Outcome.HTTP_ERROR and behaviour == "error":
        assert {r.status_code for r in result.records} == {500}


def test_a_stalled_stream_times_out_and_later_requests_still_leave_on_time(minimal_server):
    # Open loop: five requests 0.1 s apart against a server that never finishes any of them.
    reqs = prepare_requests(_trace(5, gap_s=0.1), 1024, "model")
    result = asyncio.run(replay(f"{minimal_server}/stall", reqs, timeout_s=1.0, collect_metrics=False))
    assert [r.outcome for r in result.records] == [Outcome.TIMEOUT] * 5
    assert [round(r.scheduled_s, 1) for r in result.records] == [0.0, 0.1, 0.2, 0.3, 0.4]
    # One sent after the last one's timeout would be at least 0.9 s late and the replay would last 5 s; the margins
    # are for a busy machine.
    assert max(r.lateness_s for r in result.records) < 0.5
    assert result.duration_s < 3.0, "requests must be in flight together, not one after another"


def test_a_lost_engine_leaves_the_remaining_requests_not_sent(minimal_server):
    # Two requests at once, two a minute later: the engine is reported gone once the first two are done, and the
    # replay ends then (it does not wait out the minute), however slowly a crowded machine answers the first two.
    early = _trace(2).requests
    late = tuple(TraceRequest(60.0, 16, 8) for _ in range(2))
    reqs = prepare_requests(Trace("synthetic", "native", "0" * 64, early + late), 1024, "model")
    done = []
    result = asyncio.run(replay(minimal_server, reqs, collect_metrics=False, on_done=done.append,
                                engine_alive=lambda: len(done) < 2))
    outcomes = [r.outcome for r in result.records]
    assert result.engine_lost
    assert outcomes == [Outcome.OK, Outcome.OK, Outcome.NOT_SENT, Outcome.NOT_SENT]
    assert result.duration_s < 30.0


@pytest.mark.parametrize(("stop", "said"), [(Stop("enough"), "replay stopped: enough"),
                                            (Stop("enough", Outcome.CUT), "cut by its verdict: enough")])
def test_a_stop_cancels_the_requests_in_flight_and_never_sends_those_not_yet_due(minimal_server, stop, said):
    # One request that finishes, one that would stream for a minute and a half, two due a minute later. The stop
    # rule gives its reason once the first has finished and the second is in flight: the second is cancelled and
    # recorded as the stop says (stopped: a hopeless trial; cut: a probe's verdict certain), the last two are never
    # sent, and the replay ends then, however slowly a crowded machine answers.
    timeline = (TraceRequest(0.0, 16, 8), TraceRequest(0.2, 16, 45_000), TraceRequest(60.0, 16, 8),
                TraceRequest(60.0, 16, 8))
    reqs = prepare_requests(Trace("synthetic", "native", "0" * 64, timeline), 1024, "model")
    result = asyncio.run(replay(minimal_server, reqs, collect_metrics=False,
                                should_stop=lambda live: stop if live.finished and live.in_flight else None))
    assert [r.outcome for r in result.records] == [Outcome.OK, stop.outcome, Outcome.NOT_SENT, Outcome.NOT_SENT]
    assert result.stop == stop
    assert result.stopped_as(stop.outcome) == "enough"
    assert result.stopped_as(Outcome.CUT if stop.outcome is Outcome.STOPPED else Outcome.STOPPED) is None
    assert result.records[1].sent_s is not None and result.records[2].sent_s is None
    assert all(r.error == said for r in result.records[1:])
    assert result.duration_s < 30.0


def test_a_refused_connection_is_disconnected():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = asyncio.run(replay(url, prepare_requests(_trace(2), 1024, "model"), collect_metrics=False))
    assert {r.outcome for r in result.records} == {Outcome.DISCONNECTED}


def test_prompts_have_exact_lengths_and_shared_prefix_blocks_are_identical():
    builder = PromptBuilder(vocab_size=1024, seed=3)
    a = builder.token_ids(0, TraceRequest(0.0, 1100, 5, prefix_blocks=(7, 8, 9)))
    b = builder.token_ids(1, TraceRequest(0.0, 700, 5, prefix_blocks=(7, 11)))
    c = builder.token_ids(2, TraceRequest(0.0, 600, 5))
    assert (len(a), len(b), len(c)) == (1100, 700, 600)
    assert a[:512] == b[:512] and a[512:700] != b[512:700]
    assert c[:512] != a[:512]
    assert all(10 <= t < 1024 for t in a + b + c)
    # Same seed, same prompts: a trial can be repeated exactly.
    assert PromptBuilder(1024, seed=3).token_ids(0, TraceRequest(0.0, 1100, 5, prefix_blocks=(7, 8, 9))) == a


def test_request_bodies_ask_for_exactly_the_recorded_output():
    body = json.loads(prepare_requests(_trace(1, output=37), 1024, "model")[0].body)
    assert body["max_tokens"] == 37 and body["ignore_eos"] and body["stream"] and "min_tokens" not in body
    assert len(body["prompt"]) == 16 and body["stream_options"] == {"include_usage": True}


# The stream real vLLM 0.32 (CPU build, tiny model) sent for a 4-token request when launched with
# --enable-per-request-metrics: its per-request figures ride on the last chunk, the usage one, alone.
_VLLM_CHUNK = ('{"id":"cmpl-1","object":"text_completion","created":1,"model":"model","choices":[{"index":0,'
               '"text":"x","logprobs":null,"finish_reason":%s,"stop_reason":null}]}')
_VLLM_USAGE = ('{"id":"cmpl-1","object":"text_completion","created":1,"model":"model","choices":[],'
               '"usage":{"prompt_tokens":16,"total_tokens":20,"completion_tokens":4},'
               '"system_fingerprint":"vllm-0.32.0-4f67a2c3"%s}')
_VLLM_METRICS = (',"metrics":{"time_to_first_token_ms":21.01947799746995,"generation_time_ms":28.071786000509746,'
                 '"queue_time_ms":%s,"mean_itl_ms":9.357262000169916,"tokens_per_second":81.48089240816077}')


def _send_against(usage_chunk: str, token_chunk: str = _VLLM_CHUNK) -> RequestRecord:
    """One request through `send_completion` against a canned vLLM stream: four tokens, then `usage_chunk`."""
    chunks = [token_chunk % "null"] * 3 + [token_chunk % '"length"', usage_chunk, "[DONE]"]
    stream = "".join(f"data: {c}\n\n" for c in chunks).encode()

    async def run() -> RequestRecord:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, content=stream,
                                                                 headers={"content-type": "text/event-stream"}))
        async with httpx.AsyncClient(transport=transport) as client:
            req = prepare_requests(_trace(1, output=4), 1024, "model")[0]
            return await send_completion(client, "http://engine/v1/completions", req, time.perf_counter(), 10.0)

    return asyncio.run(run())


def test_the_servers_per_request_queue_time_is_read_from_the_usage_chunk():
    record = _send_against(_VLLM_USAGE % (_VLLM_METRICS % "4.25"))
    assert record.outcome is Outcome.OK and record.output_tokens == 4
    assert record.queue_s == pytest.approx(0.00425)
    assert record.to_dict()["queue_s"] == pytest.approx(0.00425)


@pytest.mark.parametrize("metrics", [
    "",  # a server without per-request metrics (older vLLM, or the flag off)
    _VLLM_METRICS % "null",  # vLLM leaves out a figure whose timestamps it lacks
    _VLLM_METRICS % '"soon"', _VLLM_METRICS % "-1.0", _VLLM_METRICS % "true",
    ',"metrics":{}', ',"metrics":[1]',
])
def test_a_missing_or_unreadable_queue_time_is_none_and_the_request_still_counts(metrics):
    record = _send_against(_VLLM_USAGE % metrics)
    assert record.outcome is Outcome.OK and record.output_tokens == 4 and record.error is None
    assert record.queue_s is None


@pytest.mark.parametrize("raw", ["\u2028", "\u2029", "\x85"])
def test_a_token_holding_a_unicode_line_separator_does_not_cut_its_event(raw):
    """JSON may carry these raw inside a string (a random-weight model streams them); the SSE format splits
    lines at CR and LF only. Seen on 2026-12-03: one request in 160 recorded as an unreadable event."""
    token = _VLLM_CHUNK.replace('"text":"x"', f'"text":"a{raw}b"')
    record = _send_against(_VLLM_USAGE % "", token)
    assert record.outcome is Outcome.OK and record.output_tokens == 4 and record.error is None
