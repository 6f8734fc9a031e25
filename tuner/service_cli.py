"""`tuner serve`: the service on a Ray cluster (a local one unless --ray-address joins one)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from tuner.console import err
from tuner.errors import TunerError
from tuner.study_cli import ArtifactsOption, StorageOption


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8000,
    storage: StorageOption = None, artifacts: ArtifactsOption = None,
    ray_address: Annotated[Optional[str], typer.Option(envvar="RAY_ADDRESS", help="Join this Ray cluster "
                                                                                 "instead of starting a local one.")] = None,
    token_file: Annotated[Optional[Path], typer.Option(help="File holding the bearer token; default: "
                                                            "$TUNER_API_TOKEN_FILE, else $TUNER_API_TOKEN.")] = None,
) -> None:
    """Serve the tuner's HTTP API (OpenAPI at /docs) until Ctrl-C: studies, runs, live status, best, report,
    schedules."""
    import ray
    from ray import serve as ray_serve

    from storage.urls import redact_url
    from tuner.service import APP_NAME, ServiceConfig, _service_deployment, is_loopback, read_token
    from tuner.study import StoragePlan

    token = read_token(token_file)
    if token is None and not is_loopback(host):
        raise TunerError(f"refusing to serve on {host} without a token: set TUNER_API_TOKEN or give --token-file")
    plan = StoragePlan.resolve(storage, artifacts)
    plan.repository().migrate()  # a clear error now if the database cannot be reached
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with err.status("starting Ray and Ray Serve"):
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        try:
            ray_serve.start(http_options={"host": host, "port": port})
            ray_serve.run(_service_deployment().bind(ServiceConfig(plan.url, str(plan.artifact_dir), token,
                                                                   ray_address)),
                          name=APP_NAME, route_prefix="/", blocking=False)
        except BaseException:
            ray.shutdown()
            raise
    err.print(f"tuner service on http://{host}:{port}/ (OpenAPI: /docs), storage {redact_url(plan.url)}, "
              f"{'bearer token required' if token else 'no token'}; Ctrl-C stops it", highlight=False)
    try:
        stop.wait()
    finally:
        err.print("stopping the service and its runs")
        ray_serve.shutdown()
        ray.shutdown()
