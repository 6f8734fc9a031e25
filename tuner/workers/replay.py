"""Open-loop replay of a trace against a running server: each request leaves at its recorded time.

One request function per endpoint (here `/v1/completions`, streaming), one scheduler that never waits for
what is in flight, and vLLM's metrics sampled beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import ssl
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from tuner.traces.records import Trace
from tuner.traces.stats import percentile
from tuner.workers.prompts import PromptBuilder
from tuner.workers.request_record import Outcome, RequestRecord
from tuner.workers.server_metrics import SCRAPE_ERRORS, MetricsSampler, MetricsSnapshot, TimelineSample, scrape


@dataclass(frozen=True)
class ReplayRequest:
    """A trace request made ready to send: its body is serialized before the clock starts."""

    index: int
    scheduled_s: float
    input_tokens: int
    requested_tokens: int
    body: bytes


@dataclass
class ReplayResult:
    """What one replay gave: every request's record, vLLM's metrics before and after (None when they could not be read),
    the sampled timeline, and whether the engine was lost or the replay stopped early."""

    records: list[RequestRecord]
    duration_s: float  # first scheduled send to last response
    metrics_before: MetricsSnapshot | None
    metrics_after: MetricsSnapshot | None
    timeline: list[TimelineSample] = field(default_factory=list)
    engine_lost: bool = False  # the server stopped while requests were due or in flight
    stop: Stop | None = None  # why the replay was ended early on purpose, if it was

    def stopped_as(self, outcome: Outcome) -> str | None:
        """Why the replay was ended early by a stop that recorded what it cancelled as `outcome` (STOPPED: its trial
        hopeless; CUT: its verdict certain); None where none did."""
        return self.stop.reason if self.stop is not None and self.stop.outcome is outcome else None


@dataclass(frozen=True)
class Stop:
    """A reason to end a replay early, and what the requests it cancels in flight are recorded as: STOPPED where
    the trial is hopeless, CUT where the probe's verdict is certain."""

    reason: str
    outcome: Outcome = Outcome.STOPPED

    @property
    def said(self) -> str:
        """The reason as the records of the requests it ends give it."""
        return f"{'cut by its verdict' if self.outcome is Outcome.CUT else 'replay stopped'}: {self.reason}"


def prepare_requests(trace: Trace, vocab_size: int, model_name: str, seed: int = 0) -> list[ReplayRequest]:
    """Bodies for every request: token-id prompts of exact length, exact output length (ignore_eos)."""
    prompts = PromptBuilder(vocab_size, seed)
    prepared = []
    for i, req in enumerate(trace.requests):
        body = {
            "model": model_name,
            "prompt": prompts.token_ids(i, req),
            # ignore_eos alone gives exactly max_tokens; min_tokens would add a logits processor to every step.
            "max_tokens": req.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        prepared.append(ReplayRequest(i, req.arrival_s, req.input_tokens, req.output_tokens,
                                      json.dumps(body, separators=(",", ":")).encode()))
    return prepared


@dataclass
class InFlight:
    """A request on its way: when it went out and, once it came, its first token (perf_counter), and its prompt's
    length (a TTFT limit may grow with it)."""

    sent: float
    input_tokens: int
    first_token: float | None = None


@dataclass
class LiveReplay:
    """What a replay has seen so far, for a caller that decides whether going on is worth it."""

    origin: float  # perf_counter of the replay's start
    total: int  # requests in the replay
    span_s: float = 0.0  # from the first request's scheduled offset to the last's
    finished: list[RequestRecord] = field(default_factory=list)
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    due_s: dict[int, float] = field(default_factory=dict)  # each request's scheduled offset, by its index
    at_s: float | None = None  # a clock stopped this many seconds after the start (`as_of`); None: the replay's own

    def elapsed(self) -> float:
        """Seconds since the replay started."""
        return self.at_s if self.at_s is not None else time.perf_counter() - self.origin

    @classmethod
    def as_of(cls, records: Sequence[RequestRecord], at_s: float, ended_s: float) -> LiveReplay:
        """What the replay that gave `records` and ended `ended_s` seconds after its start had seen `at_s` seconds
        after it, its clock stopped there: a stop rule replayed over a finished replay. A request that failed keeps
        no time of its end, so it is taken to have ended with the replay: in flight until then, it lets no rule
        decide sooner than it could have live."""
        due = {r.index: r.scheduled_s for r in records}
        span = max(due.values(), default=0.0) - min(due.values(), default=0.0)
        live = cls(origin=0.0, total=len(records), span_s=span, due_s=due, at_s=at_s)
        for r in records:
            if r.sent_s is None or r.sent_s > at_s:
                continue
            if (r.sent_s + r.e2e_s if r.e2e_s is not None else ended_s) <= at_s:
                live.finished.append(r)
            else:
                first = r.sent_s + r.ttft_s if r.ttft_s is not None else None
                live.in_flight[r.index] = InFlight(r.sent_s, r.input_tokens,
                                                   first if first is not None and first <= at_s else None)
        return live


_JSON = {"content-type": "application/json"}


def _gap_summary(times: list[float]) -> tuple[float | None, float | None, float | None]:
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        return None, None, None
    return statistics.fmean(gaps), percentile(gaps, 95), max(gaps)


def _refused(status: int) -> bool:
    """A 4xx that says the request itself is wrong; 408 and 429 say the server was too busy to take it."""
    return 400 <= status < 500 and status not in (408, 429)


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of an event stream, split where the SSE format splits them (CR, LF or CRLF) and nowhere else.
    httpx's `aiter_lines` also splits at U+0085, U+2028 and U+2029, which JSON may carry raw inside a string: a
    token the model streams would then cut its event in two."""
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        *lines, pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace")
    if pending:
        yield pending.decode("utf-8", errors="replace")


async def send_completion(client: httpx.AsyncClient, url: str, req: ReplayRequest, origin: float,
                          timeout_s: float, progress: InFlight | None = None) -> RequestRecord:
    """One streaming /v1/completions request, timed from the moment it goes out."""
    sent = progress.sent if progress is not None else time.perf_counter()
    token_times: list[float] = []
    usage_tokens: int | None = None
    queue_s: float | None = None
    finished = False
    status: int | None = None
    error: str | None = None
    outcome: Outcome | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, content=req.body, headers=_JSON) as response:
                status = response.status_code
                if status != 200:
                    error = (await response.aread()).decode(errors="replace")[:300]
                    outcome = Outcome.REJECTED if _refused(status) else Outcome.HTTP_ERROR
                else:
                    async for line in _sse_lines(response):
                        if not line.startswith("data: "):
                            continue
                        arrived = time.perf_counter()
                        payload = line[6:]
                        if payload == "[DONE]":
                            finished = True
                            continue
                        try:
                            chunk = json.loads(payload)
                        except ValueError:
                            error, outcome = f"unreadable event: {payload[:200]}", Outcome.HTTP_ERROR
                            continue
                        if chunk.get("choices"):
                            if not token_times and progress is not None:
                                progress.first_token = arrived
                            token_times.append(arrived)
                        if chunk.get("usage"):
                            usage_tokens = chunk["usage"].get("completion_tokens")
                        if chunk.get("metrics"):  # vLLM's per-request figures, on the last (usage) chunk
                            queue_s = _queue_s(chunk["metrics"])
                        if "error" in chunk:
                            error, outcome = payload[:300], Outcome.HTTP_ERROR
    except (TimeoutError, httpx.TimeoutException):
        outcome, error = Outcome.TIMEOUT, f"no complete response within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        outcome, error = Outcome.DISCONNECTED, f"{exc.__class__.__name__}: {exc}"[:300]
    end = time.perf_counter()
    output = usage_tokens if usage_tokens is not None else len(token_times)
    if outcome is None:
        if not finished:
            outcome, error = Outcome.DISCONNECTED, "stream ended without [DONE]"
        elif output < req.requested_tokens:
            outcome = Outcome.TRUNCATED
        else:
            outcome = Outcome.OK
    itl_mean, itl_p95, itl_max = _gap_summary(token_times)
    return RequestRecord(
        index=req.index, scheduled_s=req.scheduled_s, sent_s=sent - origin, requested_tokens=req.requested_tokens,
        input_tokens=req.input_tokens, output_tokens=output, outcome=outcome,
        ttft_s=token_times[0] - sent if token_times else None,
        e2e_s=end - sent if outcome in (Outcome.OK, Outcome.TRUNCATED) else None,
        itl_mean_s=itl_mean, itl_p95_s=itl_p95, itl_max_s=itl_max, status_code=status, error=error,
        queue_s=queue_s,
    )


def _queue_s(metrics: object) -> float | None:
    """The queue time in seconds from a chunk's `metrics` object (`queue_time_ms`); None if it has none."""
    value = metrics.get("queue_time_ms") if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return None
    return value / 1000


# The event loop's timers wake up to a millisecond late (epoll's timeout is in whole milliseconds, rounded
# up): sleep to this much before the due time, then yield to other tasks until it comes.
_SPIN_S = 0.0015
_CLIENT_POOLS = 16
_KEEPALIVE_S = 1.0  # how long an idle connection to the engine is kept for the next request


async def _until(due: float, halt: asyncio.Event) -> None:
    """Return at `due` (perf_counter), or as soon as the replay is halted."""
    while not halt.is_set():
        delay = due - time.perf_counter()
        if delay <= 0:
            return
        # Short sleeps, so that a halt is noticed within a long gap between requests.
        await asyncio.sleep(min(delay - _SPIN_S, 0.25) if delay > _SPIN_S else 0)


def _unsent(req: ReplayRequest, why: str) -> RequestRecord:
    return RequestRecord(req.index, req.scheduled_s, None, req.requested_tokens, req.input_tokens, 0,
                         Outcome.NOT_SENT, error=why)


async def replay(base_url: str, requests: list[ReplayRequest], *, timeout_s: float = 600.0,
                 engine_alive: Callable[[], bool] | None = None,
                 should_stop: Callable[[LiveReplay], Stop | None] | None = None,
                 on_done: Callable[[RequestRecord], None] | None = None,
                 sample_interval_s: float = 0.25, collect_metrics: bool = True) -> ReplayResult:
    """Send every request at its scheduled offset, whatever is in flight, and gather what happened.

    Polled every 0.25 s while replaying: `engine_alive` (once False, the requests not yet due are recorded
    as not sent and those in flight are left to fail as users would see them fail) and `should_stop` (a
    reason to end the replay early: requests not yet due are not sent, those in flight are cancelled, so that
    vLLM aborts them, and recorded as its `Stop.outcome` says).
    """
    url = f"{base_url}/v1/completions"
    # No cap on connections (open loop). httpcore scans its whole pool for every request, so the
    # connections are spread over several pools, each small. An idle connection is dropped after 1 s, well
    # before the server's keep-alive timeout (uvicorn's 5 s, httpx's own default too): a request sent on one the
    # server is closing at that moment would fail with no fault of the engine's (seen as `disconnected`).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=_KEEPALIVE_S)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with contextlib.AsyncExitStack() as stack:
        tls = ssl.create_default_context()  # one for all pools: each would build its own, slowly
        clients = [await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=timeout, verify=tls))
                   for _ in range(_CLIENT_POOLS)]
        metrics_client = await stack.enter_async_context(httpx.AsyncClient(timeout=5.0))
        lost = False
        before = None
        if collect_metrics:
            try:
                before = await scrape(metrics_client, base_url)
            except SCRAPE_ERRORS:  # gone between /health and here: the watcher below ends the replay
                lost = True
        sampler = MetricsSampler(metrics_client, base_url, sample_interval_s)
        span = max((r.scheduled_s for r in requests), default=0.0) - min((r.scheduled_s for r in requests), default=0.0)
        # The origin lies a moment ahead, to enter the loop.
        live = LiveReplay(origin=time.perf_counter() + 0.05, total=len(requests), span_s=span,
                          due_s={r.index: r.scheduled_s for r in requests})
        sampler_task = asyncio.create_task(sampler.run(live.origin)) if collect_metrics else None
        halt = asyncio.Event()
        stop: Stop | None = None
        tasks: dict[int, asyncio.Task[RequestRecord]] = {}

        async def watch() -> None:
            nonlocal lost, stop
            while not halt.is_set():
                if engine_alive is not None and not engine_alive():
                    lost = True
                elif should_stop is not None and (stop := should_stop(live)) is not None:
                    for task in tasks.values():
                        task.cancel()
                if lost or stop is not None:
                    halt.set()
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())

        def stopped(req: ReplayRequest, sent: float) -> RequestRecord:
            assert stop is not None  # only a stop cancels a request
            return RequestRecord(req.index, req.scheduled_s, sent, req.requested_tokens, req.input_tokens, 0,
                                 stop.outcome, error=stop.said)

        async def tracked(req: ReplayRequest) -> RequestRecord:
            progress = live.in_flight[req.index] = InFlight(time.perf_counter(), req.input_tokens)
            try:
                record = await send_completion(clients[req.index % _CLIENT_POOLS], url, req, live.origin,
                                               timeout_s, progress)
            except asyncio.CancelledError:
                record = stopped(req, progress.sent - live.origin)
            del live.in_flight[req.index]
            live.finished.append(record)
            if on_done is not None:
                on_done(record)
            return record

        skipped: list[RequestRecord] = []
        for req in requests:
            await _until(live.origin + req.scheduled_s, halt)
            if halt.is_set():
                skipped.append(_unsent(req, stop.said if stop is not None
                                       else "the engine was gone before this request was due"))
                continue
            tasks[req.index] = asyncio.create_task(tracked(req))
        by_index = {req.index: req for req in requests}
        records = []
        for i, result in zip(tasks, await asyncio.gather(*tasks.values(), return_exceptions=True)):
            if isinstance(result, asyncio.CancelledError):  # cancelled before it ever ran: nothing went out
                assert stop is not None
                result = _unsent(by_index[i], stop.said)
            elif isinstance(result, BaseException):
                raise result
            records.append(result)
        duration = time.perf_counter() - live.origin
        watcher.cancel()
        if sampler_task is not None:
            sampler_task.cancel()
        after = None
        if collect_metrics and not lost:
            try:
                after = await scrape(metrics_client, base_url)
            except SCRAPE_ERRORS:
                lost = True
    for record in skipped:
        if on_done is not None:
            on_done(record)
    records = sorted(records + skipped, key=lambda r: r.index)
    return ReplayResult(records, duration, before, after, sampler.samples, engine_lost=lost, stop=stop)
