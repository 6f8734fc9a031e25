"""An engine core that dies mid-replay, as a trial sees it without vLLM: vLLM's /health says 503 while its API
server lingers, and a probe the stop rule ended early on a dead engine makes the trial engine_died, not pruned."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from factories import measurement
from tuner.traces.records import Trace, TraceRequest
from tuner.workers import trial as trial_module
from tuner.workers.engine_config import EngineConfig
from tuner.workers.failures import EngineFailure, FailureClass
from tuner.workers.launch import RunningEngine, free_port
from tuner.workers.probes import Probe, ProbeRun
from tuner.workers.trial import TrialSpec, run_trial


@pytest.fixture
def health_server():
    """A stand-in for vLLM's API server whose /health answers the status set in `status[0]`."""
    status = [200]

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's name is http.server's)
            self.send_response(status[0] if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", status
    finally:
        server.shutdown()
        server.server_close()


def _engine(base_url: str) -> RunningEngine:
    return RunningEngine(process=None, argv=[], base_url=base_url, log_path=Path("/nonexistent"), startup_s=1.0,
                         launched_at=0.0, _live=False)


def test_health_503_is_a_dead_engine_and_200_or_no_answer_is_not(health_server):
    url, status = health_server
    assert not _engine(url).engine_dead()
    status[0] = 503  # vLLM's answer once its engine core is gone (EngineDeadError)
    assert _engine(url).engine_dead()
    status[0] = 500
    assert not _engine(url).engine_dead(), "only vLLM's own word for a dead engine counts"
    assert not _engine(f"http://127.0.0.1:{free_port()}").engine_dead(), "no answer is not taken as death"


@dataclass
class FakeEngine:
    """A running engine as run_trial sees it: its process alive, its engine core dead or not."""

    dead: bool
    asked: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    startup_s: float = 1.0
    launched_at: float = 0.0

    def alive(self) -> bool:
        return True

    def engine_dead(self) -> bool:
        self.asked.append("engine_dead")
        return self.dead

    def failure(self) -> EngineFailure:
        return EngineFailure(FailureClass.ENGINE_DIED, "the engine stopped during replay (exit code 0)", 0, "")

    def stop(self) -> float:
        return 0.0


def _run(tmp_path, monkeypatch, engine: FakeEngine, stop_reason: str | None):
    monkeypatch.setattr(trial_module, "inspect_model", lambda path: type("Info", (), {"vocab_size": 1024})())
    monkeypatch.setattr(trial_module, "start_engine", lambda *args, **kwargs: engine)
    probe = Probe(0, 1.0, 7, 16, measurement(requests=16, completed=3, failed=1,
                                             outcomes={"ok": 3, "http_error": 1, "not_sent": 12}),
                  stop_reason=stop_reason)
    monkeypatch.setattr(trial_module, "run_probes", lambda *args, **kwargs: [ProbeRun(probe)])
    trace = Trace("synthetic", "native", "0" * 64, (TraceRequest(0.0, 16, 8),))
    return run_trial(TrialSpec(tmp_path / "model", trace, EngineConfig(max_num_seqs=4), tmp_path / "trial"))


def test_a_probe_stopped_early_on_a_dead_engine_is_the_engines_death(tmp_path, monkeypatch):
    engine = FakeEngine(dead=True)
    record = _run(tmp_path, monkeypatch, engine, "1 of 16 requests already failed").record
    assert record.failure is not None and record.failure.kind is FailureClass.ENGINE_DIED
    assert engine.asked == ["engine_dead"]


def test_a_probe_stopped_early_on_a_live_engine_stays_a_prune(tmp_path, monkeypatch):
    engine = FakeEngine(dead=False)
    record = _run(tmp_path, monkeypatch, engine, "p95 cannot meet it").record
    assert record.failure is None and record.stop_reason == "p95 cannot meet it"


def test_a_probe_run_to_its_end_does_not_ask_the_engine(tmp_path, monkeypatch):
    engine = FakeEngine(dead=True)
    record = _run(tmp_path, monkeypatch, engine, None).record
    assert record.failure is None and engine.asked == []
