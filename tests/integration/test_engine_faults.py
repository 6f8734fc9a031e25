"""Faults injected for real and counted: vLLM killed at seeded random moments of a study's replays, a server
that answers errors or breaks its streams, and requests longer than the engine's context."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from conftest import (AZURE_CONV, FIXED_LOAD, NO_LATENCY_LIMIT_ARGS, REPO, DescendantWatch, assert_none_left, run_tuner,
                      vllm_processes)
from faulty_server import (CLOSED_MIDSTREAM, EMPTY_BODY, ERROR_EVENT, FAULTS, MALFORMED_EVENT, OK,
                           RESET_BEFORE_RESPONSE, RESET_MIDSTREAM, SHORT, STALLED, STATUS_400, STATUS_429,
                           STATUS_500, STATUS_503, STATUS_OF)
from tuner.analysis.capacity import JudgedProbe, Verdict
from tuner.analysis.scoring import boundary
from tuner.storage import Repository
from tuner.traces.records import Trace, TraceRequest
from tuner.traces.selection import TraceSelection, load_trace
from tuner.workers.engine_config import EngineConfig
from tuner.workers.launch import _wait_healthy, free_port
from tuner.workers.measure import measure
from tuner.workers.replay import prepare_requests, replay
from tuner.workers.request_record import Outcome
from tuner.workers.trial import TrialSpec, run_trial
from factories import TINY_ENGINE, tiny_space

KV_BYTES = TINY_ENGINE["kv_cache_memory_bytes"]

# --- vLLM killed mid-replay, inside a real study -----------------------------------------------------------

# Each kill target once, in a seeded order: every trial killed ends as engine_died, whichever process died.
KILL_TARGETS = ("api_server", "engine_core")
KILLS = len(KILL_TARGETS)
KILL_SEED = 20261202
# The study replays the first 16 requests of the Azure conversation trace at their recorded rate: one at 0 s,
# the other fifteen from 4.3 s to 11.2 s. A kill within 6 s of the first always leaves requests to come.
KILL_DELAY_S = (0.5, 6.0)
STUDY_REQUESTS = 16
STUDY_SPACE = tiny_space("engine-faults", {"max_num_seqs": {"type": "int", "low": 4, "high": 16}},
                         description="the tiny model, every proposal launchable, so that each trial's engine can be "
                                     "killed")
SERVER_MODULE = ["-m", "vllm.entrypoints.openai.api_server"]
ENGINE_CORE_PID = re.compile(r"\(EngineCore pid=(\d+)\)")
SERVED = "POST /v1/completions"  # the server's access log line for each request it begins to answer


@dataclass(frozen=True)
class Kill:
    server_pid: int  # the API server's, whichever process was killed
    target: str  # "api_server" or "engine_core"
    delay_s: float  # after the server began answering its first request
    served_before: int  # requests it had begun answering when it was killed


class EngineKiller(threading.Thread):
    """SIGKILLs the next `count` vLLM servers started below process `root`, each at a seeded random moment of
    its replay: the API server or its engine core, each target in turn (in a seeded order)."""

    def __init__(self, root: int, count: int, seed: int):
        super().__init__(daemon=True)
        self.root, self.count, self.rng = root, count, random.Random(seed)
        self.targets = self.rng.sample(KILL_TARGETS, len(KILL_TARGETS))
        self.kills: list[Kill] = []
        self.finished = threading.Event()  # set once the study has ended, kills or not
        self.error: BaseException | None = None

    def run(self) -> None:
        seen: set[int] = set()
        try:
            while len(self.kills) < self.count and (server := self._next_server(seen)) is not None:
                seen.add(server.pid)
                self._kill_mid_replay(server)
        except BaseException as exc:  # the test reads it: a failure in this thread must not pass unseen
            self.error = exc

    def _next_server(self, seen: set[int]) -> psutil.Process | None:
        while not self.finished.is_set():
            try:
                new = [proc for proc in _servers_below(psutil.Process(self.root)) if proc.pid not in seen]
            except psutil.NoSuchProcess:
                return None
            if new:
                return new[0]
            time.sleep(0.2)
        return None

    def _kill_mid_replay(self, server: psutil.Process) -> None:
        delay, target = self.rng.uniform(*KILL_DELAY_S), self.targets[len(self.kills) % len(self.targets)]
        log = Path(os.readlink(f"/proc/{server.pid}/fd/1"))  # the trial's server.log, written unbuffered
        while SERVED not in log.read_text(errors="replace"):
            assert server.is_running() and not self.finished.is_set(), f"server {server.pid} never replayed"
            time.sleep(0.1)
        time.sleep(delay)
        victim = server if target == "api_server" else self._engine_core(server, log.read_text(errors="replace"))
        served = log.read_text(errors="replace").count(SERVED)
        victim.send_signal(signal.SIGKILL)
        self.kills.append(Kill(server.pid, target, delay, served))

    @staticmethod
    def _engine_core(server: psutil.Process, log_text: str) -> psutil.Process:
        """The engine core of `server`, by the pid its own log lines carry: its process name, cut to 15 characters
        by the kernel, was not found among the server's children once on a crowded machine."""
        pids = {int(pid) for pid in ENGINE_CORE_PID.findall(log_text)}
        assert len(pids) == 1, f"server {server.pid} logged engine cores {pids}"
        core = psutil.Process(pids.pop())
        assert core.ppid() == server.pid, f"engine core {core.pid} is not a child of server {server.pid}"
        return core


def _servers_below(root: psutil.Process) -> list[psutil.Process]:
    """The vLLM API servers among `root`'s descendants (NoSuchProcess if `root` is gone)."""
    found = []
    for proc in root.children(recursive=True):
        try:
            if proc.cmdline()[1:3] == SERVER_MODULE:
                found.append(proc)
        except psutil.Error:  # a short-lived child gone meanwhile
            continue
    return found


def _wait_no_vllm(timeout_s: float = 30.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := vllm_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.vllm
def test_engines_killed_mid_replay_are_engine_died_and_the_study_goes_on(tiny_model, tmp_path, record_property):
    (tmp_path / "space.yaml").write_text(STUDY_SPACE)
    storage = f"sqlite:///{tmp_path / 'tuner.db'}"
    common = ["--storage", storage, "--artifacts", str(tmp_path / "artifacts")]
    run_tuner("study", "create", "k", "--model", str(tiny_model), "--trace", str(AZURE_CONV), "--max-requests",
              str(STUDY_REQUESTS), "--fit", "clip", "--space", str(tmp_path / "space.yaml"), "--seed", "5",
              *NO_LATENCY_LIMIT_ARGS, *FIXED_LOAD, *common)
    driver = subprocess.Popen([sys.executable, "-m", "tuner", "study", "run", "k", "--trials", str(KILLS + 1),
                               "--no-validate", "--json", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    watch = DescendantWatch(driver.pid)
    watch.start()
    killer = EngineKiller(driver.pid, KILLS, KILL_SEED)
    killer.start()
    try:
        stdout, stderr = driver.communicate(timeout=900)
    finally:
        killer.finished.set()
        killer.join(30)
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
    assert driver.returncode == 0, stderr[-3000:]
    watched = assert_none_left(watch)
    assert killer.error is None, repr(killer.error)
    assert len(killer.kills) == KILLS
    assert sorted(k.target for k in killer.kills) == sorted(KILL_TARGETS), "each target killed once"

    summaries = json.loads(stdout)["trials"]
    assert [s["number"] for s in summaries] == list(range(KILLS + 1)), "every trial asked for was run and kept"
    repo = Repository(storage)
    stored = {t.trial_number: t for t in repo.trials("k")}
    assert sorted(stored) == list(range(KILLS + 1))
    outcomes_of_killed = []
    for number, kill in enumerate(killer.kills):
        trial = stored[number]
        log = tmp_path / "artifacts" / "trials" / "k" / f"trial-{number:04d}" / "server.log"
        assert f"(APIServer pid={kill.server_pid})" in log.read_text(errors="replace"), "trials run in order"
        assert (trial.state, trial.failure_class) == ("failed", "engine_died"), (kill, trial.failure_message)
        requests = repo.requests("k", number)
        assert [r.index for r in requests] == list(range(STUDY_REQUESTS))
        outcomes = Counter(r.outcome for r in requests)
        assert set(outcomes) <= {"ok", "http_error", "disconnected", "not_sent"}, (kill, outcomes)
        # Only a request the server had begun before the kill can have been served; the kill cost some.
        assert outcomes["ok"] <= kill.served_before < STUDY_REQUESTS, (kill, outcomes)
        assert all((r.sent_s is None) == (r.outcome == "not_sent") for r in requests)
        assert trial.measurement.outcomes == dict(outcomes), "the measurement counts what the requests say"
        outcomes_of_killed.append(outcomes)
    after = stored[KILLS]
    assert after.state == "complete" and after.failure_class is None
    assert Counter(r.outcome for r in repo.requests("k", KILLS)) == {"ok": STUDY_REQUESTS}
    assert not _wait_no_vllm(), "no vLLM process may outlive the study"
    assert not any(psutil.pid_exists(k.server_pid) for k in killer.kills)

    record_property("kills", json.dumps([k.__dict__ for k in killer.kills]))
    record_property("killed_trial_outcomes", json.dumps([dict(o) for o in outcomes_of_killed]))
    record_property("driver_processes_watched", json.dumps(Counter(watched)))


# --- a server that answers errors or breaks its streams ----------------------------------------------------

FAULT_SEED = 6
FAULTY_REQUESTS = 300
# Far above an answer's 16 ms: on a loaded CI machine (vLLM busy in the other worker) an OK request once
# took over 2 s to connect and stream, and was recorded as a timeout.
REQUEST_TIMEOUT_S = 10.0
EXPECTED_OUTCOME = {
    OK: Outcome.OK, SHORT: Outcome.TRUNCATED, STATUS_400: Outcome.REJECTED,
    STATUS_429: Outcome.HTTP_ERROR, STATUS_500: Outcome.HTTP_ERROR, STATUS_503: Outcome.HTTP_ERROR,
    ERROR_EVENT: Outcome.HTTP_ERROR, MALFORMED_EVENT: Outcome.HTTP_ERROR,
    CLOSED_MIDSTREAM: Outcome.DISCONNECTED, RESET_MIDSTREAM: Outcome.DISCONNECTED,
    RESET_BEFORE_RESPONSE: Outcome.DISCONNECTED, EMPTY_BODY: Outcome.DISCONNECTED, STALLED: Outcome.TIMEOUT,
}


@pytest.fixture
def faulty_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "faulty_server.py"), "--port", str(port),
                             "--seed", str(FAULT_SEED), "--stall-s", str(REQUEST_TIMEOUT_S + 2)])
    url = f"http://127.0.0.1:{port}"
    try:
        assert _wait_healthy(proc, url, 30), "the faulty server did not start"
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # still holding stalled answers open: nothing of it is needed now
            proc.kill()
            proc.wait(10)


def test_every_request_to_a_misbehaving_server_is_recorded_with_the_fault_it_met(faulty_server, record_property):
    proc, url = faulty_server
    # 300 requests 10 ms apart, open loop: faults of every kind are in flight together.
    trace = Trace("synthetic", "native", "0" * 64,
                  tuple(TraceRequest(i * 0.01, 16, 8) for i in range(FAULTY_REQUESTS)))
    requests = prepare_requests(trace, 1024, "model")
    result = asyncio.run(replay(url, requests, timeout_s=REQUEST_TIMEOUT_S, engine_alive=lambda: proc.poll() is None))
    ledger = httpx.get(f"{url}/ledger").json()
    met = {entry["sha256"]: entry["fault"] for entry in ledger}
    assert len(ledger) == len(met) == FAULTY_REQUESTS, "each request reached the server exactly once"
    faults = [met[hashlib.sha256(r.body).hexdigest()] for r in requests]
    assert set(faults) == set(FAULTS)
    assert not result.engine_lost
    assert [r.index for r in result.records] == list(range(FAULTY_REQUESTS))
    assert [r.outcome for r in result.records] == [EXPECTED_OUTCOME[f] for f in faults]
    for record, fault in zip(result.records, faults):
        if fault in STATUS_OF:
            assert record.status_code == STATUS_OF[fault] and f"injected {STATUS_OF[fault]}" in record.error
        elif fault == OK:
            assert record.output_tokens == 8 and record.error is None and record.e2e_s >= record.ttft_s > 0
        elif fault == SHORT:
            assert record.output_tokens == 4 and record.e2e_s is not None
        elif fault == MALFORMED_EVENT:
            assert record.error.startswith("unreadable event")
        else:
            assert record.error and record.e2e_s is None
    expected_counts = Counter(EXPECTED_OUTCOME[f].value for f in faults)
    assert measure(result).outcomes == expected_counts
    record_property("faults", json.dumps(Counter(faults)))
    record_property("outcomes", json.dumps(expected_counts))


# --- requests longer than the engine's context -------------------------------------------------------------

CONTEXT = 512
# The first 24 requests of the Azure conversation trace, ten times faster: several are longer than 512 tokens.
LONG_SELECTION = dict(max_requests=24, rate_scale=10.0)


def _against_context(trace: Trace) -> tuple[set[int], dict[int, int]]:
    """What vLLM does with each request against CONTEXT: the ones it refuses (a prompt that leaves no room for
    one output token, or more output than the context holds), and the ones whose output it cuts to the room
    left (index -> the tokens it will give)."""
    refused, cut = set(), {}
    for i, r in enumerate(trace.requests):
        if r.input_tokens >= CONTEXT or r.output_tokens > CONTEXT:
            refused.add(i)
        elif r.input_tokens + r.output_tokens > CONTEXT:
            cut[i] = CONTEXT - r.input_tokens
    return refused, cut


@pytest.mark.vllm
def test_requests_beyond_max_model_len_are_rejected_by_vllm_and_counted(tiny_model, tmp_path, record_property):
    refused, cut = _against_context(load_trace(AZURE_CONV, TraceSelection(**LONG_SELECTION)))
    assert refused and cut, "the slice must hold requests too long for the context"
    out_dir = tmp_path / "trial"
    result = run_tuner("trial", "run", "--model", str(tiny_model), "--trace", str(AZURE_CONV), "--max-requests", "24",
                       "--rate-scale", "10", *FIXED_LOAD, "--set", f"max_model_len={CONTEXT}",
                       "--set", "enforce_eager=true",
                       "--set", f"kv_cache_memory_bytes={KV_BYTES}", "--out", str(out_dir), "--json")
    record = json.loads(result.stdout)
    assert record["failure"] is None, "refused requests are the requests' fault, not the engine's"
    rows = list(csv.DictReader(open(out_dir / "requests.csv")))
    for i, row in enumerate(rows):
        if i in refused:
            assert row["outcome"] == "rejected" and row["status_code"] == "400" and "BadRequestError" in row["error"]
        elif i in cut:
            assert row["outcome"] == "truncated" and int(row["output_tokens"]) == cut[i]
        else:
            assert row["outcome"] == "ok" and row["output_tokens"] == row["requested_tokens"]
    m = record["measurement"]
    fitting = len(rows) - len(refused) - len(cut)
    assert m["outcomes"] == {k: v for k, v in
                             {"ok": fitting, "rejected": len(refused), "truncated": len(cut)}.items() if v}
    assert m["completed"] == fitting and m["failed"] == len(refused) + len(cut)
    record_property("outcomes", json.dumps(m["outcomes"]))


@pytest.mark.vllm
def test_with_fit_clip_every_request_is_served_and_the_clipped_count_is_recorded(tiny_model, tmp_path,
                                                                                 record_property):
    refused, cut = _against_context(load_trace(AZURE_CONV, TraceSelection(**LONG_SELECTION)))
    trace = load_trace(AZURE_CONV, TraceSelection(**LONG_SELECTION, fit="clip"), CONTEXT)
    config = EngineConfig(max_model_len=CONTEXT, enforce_eager=True, kv_cache_memory_bytes=KV_BYTES)
    outcome = run_trial(TrialSpec(tiny_model, trace, config, tmp_path))
    fit_step = outcome.record.trace.transformations[-1]
    clipped = re.fullmatch(rf"fit_clip\(max_model_len={CONTEXT}, mode=clip, .*\): (\d+) requests affected", fit_step)
    assert clipped and int(clipped.group(1)) == len(refused) + len(cut), fit_step
    assert json.loads((tmp_path / "measurement.json").read_text())["trace"]["transformations"][-1] == fit_step
    m = outcome.record.measurement
    assert outcome.record.failure is None and m.outcomes == {"ok": 24}
    assert m.actual_output_tokens == m.requested_output_tokens
    record_property("clipped", int(clipped.group(1)))


# --- an engine that dies during a later probe ---------------------------------------------------------------


@dataclass(frozen=True)
class KillDuringSecondProbe:
    """A load plan of two probes that, once asked for the second, SIGKILLs this test's vLLM server as soon as the
    server begins answering a request of that probe: the engine dies while the probe runs, not between probes."""

    warmup_requests: int = 0
    min_requests: int = 0
    min_span_s: float = 0.0

    def next_factor(self, runs) -> float | None:
        if not runs:
            return 1.0
        if len(runs) == 1:
            server = _own_server()
            log = Path(os.readlink(f"/proc/{server.pid}/fd/1"))  # the trial's server.log, written unbuffered
            served = log.read_text(errors="replace").count(SERVED)
            threading.Thread(target=_kill_once_served, args=(server, log, served), daemon=True).start()
            return 2.0
        return None


def _own_server() -> psutil.Process:
    """This process's own vLLM server: another test worker's may be running beside it."""
    servers = _servers_below(psutil.Process())
    assert servers, "this test's vLLM server is not running"
    return servers[0]


def _kill_once_served(server: psutil.Process, log: Path, served_before: int) -> None:
    while server.is_running() and log.read_text(errors="replace").count(SERVED) <= served_before:
        time.sleep(0.02)
    with contextlib.suppress(psutil.NoSuchProcess):
        server.send_signal(signal.SIGKILL)


@pytest.mark.vllm
def test_an_engine_that_dies_during_a_later_probe_is_engine_died_with_the_probes_so_far_kept(tiny_model, tmp_path):
    trace = load_trace(AZURE_CONV, TraceSelection(max_requests=8, rate_scale=100.0, fit="clip"), 1024)
    config = EngineConfig(max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=KV_BYTES)
    phases: list[str] = []
    outcome = run_trial(TrialSpec(tiny_model, trace, config, tmp_path, load=KillDuringSecondProbe()),
                        on_phase=phases.append)
    record = outcome.record
    # Each probe says, as it begins, how many requests it replays and how long their arrivals last: at twice the
    # load, the 8 requests twice over, to last as long as the first probe's.
    said = [phase.split(" of arrivals")[0] for phase in phases if phase.startswith("probe ")]
    assert [re.sub(r"over \S+$", "over T", phase) for phase in said] == [
        "probe 1 at x1 the reference load: 8 requests over T", "probe 2 at x2 the reference load: 16 requests over T"]
    assert record.failure is not None and record.failure.kind.value == "engine_died"
    first, second = record.probes
    assert first.measurement.completed == 8 and not first.engine_lost
    assert second.engine_lost and second.factor == 2.0
    judged = [JudgedProbe.of(run, boundary("interactive")) for run in outcome.probes]
    assert judged[1].verdict is Verdict.FAIL and judged[1].reasons == ["the engine died during the probe"]
    # Kept in the trial's record on disk too, the first probe's measurement whole.
    saved = json.loads((tmp_path / "measurement.json").read_text())
    assert [p["engine_lost"] for p in saved["probes"]] == [False, True]
    assert saved["measurement"]["completed"] == 8
    assert not _wait_no_vllm(), "no engine may be left behind"
