"""Shared fixtures: the tiny model, the real traces, and the check that no engine outlives a test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# PostgreSQL: the `postgres_url` (session) and `postgres_database` (per test) fixtures.
pytest_plugins = ["postgres"]

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
AZURE_CONV = TRACES / "azure_conv_2023.csv"


def vllm_processes() -> list[psutil.Process]:
    """Every live vLLM server or engine-core process on this machine.

    A zombie is left out: it has exited and holds nothing but its exit status. One whose parent died is
    reparented to PID 1, and a container's PID 1 need not reap it."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if "vllm.entrypoints" in cmdline or (proc.info["name"] or "").startswith("VLLM"):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tuner.models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(autouse=True)
def no_engine_left_behind(request):
    """After every test that launches vLLM, no vLLM process may remain."""
    yield
    if request.node.get_closest_marker("vllm") is None:
        return
    deadline = time.monotonic() + 5
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = vllm_processes()
    assert not left, f"vLLM processes left behind: {[(p.pid, p.name()) for p in left]}"


def run_tuner(*args: str) -> subprocess.CompletedProcess:
    """The `tuner` command line as a user runs it; a non-zero exit fails the test with its stderr."""
    result = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
