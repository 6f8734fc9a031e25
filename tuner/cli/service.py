"""`tuner serve`: the service on a Ray cluster (a local one unless --ray-address joins one); `tuner dashboard`:
optuna-dashboard on the studies' storage."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from optuna.artifacts import FileSystemArtifactStore

from tuner.common.api_token import read_token
from tuner.cli.options import ArtifactsOption, RayAddressOption, StorageOption, storage_plan
from tuner.common.console import err
from tuner.common.errors import TunerError
from tuner.storage.urls import redact_url

# Read by Ray as it is imported: at 0 its node address is loopback, so a local cluster listens on loopback only.
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray Serve kills an HTTP proxy that is not ready within this many seconds (5 by default), and the start of the
# service fails with it: on a busy machine of two cores a proxy takes longer. Read by Serve's controller, which a
# local cluster starts with this process's environment; an operator's own setting is kept.
SERVE_PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
SERVE_PROXY_READY_S = "60"


def is_loopback(host: str) -> bool:
    """True if every address `host` names is a loopback one (so only this machine can connect)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise TunerError(f"cannot resolve the address to bind: {host}") from None
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def refuse_taken_address(host: str, port: int) -> None:
    """TunerError if another process listens on `host`:`port` already."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        raise TunerError(f"cannot serve on {host}:{port}: {os.strerror(exc.errno) if exc.errno else exc}") from None


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8000,
    storage: StorageOption = None, artifacts: ArtifactsOption = None,
    ray_address: RayAddressOption = None,
    token_file: Annotated[Optional[Path], typer.Option(help="File holding the bearer token; default: "
                                                            "$TUNER_API_TOKEN_FILE, else $TUNER_API_TOKEN.")] = None,
) -> None:
    """Serve the tuner's HTTP API (OpenAPI at /docs) until Ctrl-C: studies, runs, live status, best, report,
    schedules."""
    loopback = is_loopback(host)
    if loopback and not ray_address:
        # Else the local Ray cluster would listen on every address, reachable where the service is not.
        os.environ[RAY_LOOPBACK_ENV] = "0"
    os.environ.setdefault(SERVE_PROXY_READY_ENV, SERVE_PROXY_READY_S)
    # lazy: keeps the CLI's start fast (FastAPI, Ray Serve) and loads Ray only once the environment above is set
    from tuner.service.api import ServiceConfig, host_service

    token = read_token(token_file)
    if token is None and not loopback:
        raise TunerError(f"refusing to serve on {host} without a token: set TUNER_API_TOKEN or give --token-file")
    plan = storage_plan(storage, artifacts)
    plan.repository()  # migrated on first use: a clear error now if the database cannot be reached
    refuse_taken_address(host, port)  # before Ray starts: the common case in a second, not after a traceback
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    starting = err.status("starting Ray and Ray Serve")
    starting.start()

    def ready() -> None:
        starting.stop()
        err.print(f"tuner service on http://{host}:{port}/ (OpenAPI: /docs), storage {redact_url(plan.url)}, "
                  f"{'bearer token required' if token else 'no token'}; Ctrl-C stops it", highlight=False)

    try:
        host_service(ServiceConfig(plan.url, str(plan.artifact_dir), token, ray_address), host, port, stop, ready,
                     on_stopping=lambda: err.print("stopping the service and its runs"))
    finally:
        starting.stop()  # also when the start failed


def dashboard(storage: StorageOption = None, artifacts: ArtifactsOption = None,
              host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
              port: Annotated[int, typer.Option(help="Port.")] = 8080) -> None:
    """Start optuna-dashboard on the same storage and artifact store."""
    # lazy: keeps the CLI's start fast (optuna-dashboard)
    from optuna_dashboard import run_server

    plan = storage_plan(storage, artifacts)
    plan.repository()  # a clear error now if the database cannot be reached
    plan.artifact_dir.mkdir(parents=True, exist_ok=True)
    err.print(f"optuna-dashboard for {redact_url(plan.url)} on http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        run_server(plan.optuna_storage(), host=host, port=port,
                   artifact_store=FileSystemArtifactStore(str(plan.artifact_dir)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
