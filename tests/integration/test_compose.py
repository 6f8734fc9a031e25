"""The team deployment (docker-compose.yml, .env.example, workers/Dockerfile): valid against the Compose
Specification, every service health-checked, every command it runs one this package (or Ray, or PostgreSQL)
really has, and the health checks themselves run here against the real programs. No Docker engine runs here."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import click
import jsonschema
import psutil
import pytest
import typer.main
import yaml
from sqlalchemy.engine import make_url

from tuner.workers.launch import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "workers" / "Dockerfile"
SCHEMA = Path(__file__).resolve().parents[1] / "data" / "compose-spec.json"
SECRETS = ("POSTGRES_PASSWORD", "TUNER_API_TOKEN", "RAY_AUTH_TOKEN")


# --- reading the files as compose does ---------------------------------------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    """`NAME=VALUE` lines; blank lines and `#` comments skipped (the values here need no quoting)."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_]\w*", name), f"{path}:{number}: not NAME=VALUE: {line!r}"
        values[name] = value
    return values


class MissingVariable(Exception):
    """A `${NAME:?message}` whose variable is unset: compose refuses to start."""


# Compose's interpolation: $$ is a dollar; ${NAME}, $NAME, ${NAME:-default}, ${NAME-default}, ${NAME:?error},
# ${NAME?error} (the colon forms treat an empty value as unset); any other `$` is an error.
_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                       r"|(?P<bare>[A-Za-z_]\w*)|(?P<invalid>))")


def interpolate(value, env: dict[str, str]):
    """Every string value of a loaded compose file (not its keys) with its variables substituted."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        if match["dollar"]:
            return "$"
        if match["invalid"] is not None:
            raise ValueError(f"invalid interpolation in {value!r}")
        name, op = match["braced"] or match["bare"], match["op"] or ""
        given = bool(env.get(name)) if op.startswith(":") else name in env
        if op.endswith("-"):
            return env[name] if given else match["arg"]
        if op.endswith("?") and not given:
            raise MissingVariable(f"{name}: {match['arg']}")
        return env.get(name, "")

    return _VARIABLE.sub(substitute, value)


def variables_named(text: str) -> set[str]:
    return {m["braced"] or m["bare"] for m in _VARIABLE.finditer(text) if m["braced"] or m["bare"]}


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def compose(env) -> dict:
    """docker-compose.yml as compose runs it with .env.example as its .env (YAML anchors and merges resolved)."""
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)


def argvs(command: list[str]) -> list[list[str]]:
    """The programs a command runs: itself, or each of `sh -c 'A && exec B'`."""
    if command[:2] != ["sh", "-c"]:
        return [command]
    assert len(command) == 3, command
    lexer = shlex.shlex(command[2], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found, current = [], []
    for token in lexer:
        if token in ("&&", ";"):
            found.append(current)
            current = []
        elif token == "exec" and not current:
            continue  # `exec B` runs B in the shell's place
        else:
            assert not set(token) & set("|&;<>()"), f"unexpected shell syntax {token!r} in {command[2]!r}"
            current.append(token)
    return [*found, current]


def service_argvs(service: dict) -> list[list[str]]:
    """Everything a service runs: its command and its health check."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", f"health check not in exec form: {test}"
    return [*argvs(service.get("command", [])), test[1:]] if "command" in service else [test[1:]]


# --- the file itself ---------------------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_specification(compose) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []
    assert set(compose["services"]) == {"postgres", "ray-head", "tuner", "dashboard", "ray-gpu-worker"}


def test_the_schema_refuses_a_broken_service(compose) -> None:
    """The vendored schema is the real one: it catches what compose would refuse."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    broken = {**compose, "services": {**compose["services"], "tuner": {**compose["services"]["tuner"],
                                                                        "restart_policy": "always"}}}
    assert [e.message for e in validator.iter_errors(broken)] == [
        "'restart_policy' does not match any of the regexes: '^x-'"]


def test_every_variable_is_set_in_the_example_environment_and_nothing_else_is(env) -> None:
    text = COMPOSE.read_text()
    secret_sources = {s["environment"] for s in yaml.safe_load(text)["secrets"].values()}
    assert variables_named(text) | secret_sources == set(env)


def test_the_example_environment_holds_placeholders_not_secrets(env) -> None:
    for name in SECRETS:
        assert env[name].startswith("change-me"), name
    # The password goes into the database URL unquoted: the example keeps to the characters the file allows.
    assert re.fullmatch(r"[A-Za-z0-9._~-]+", env["POSTGRES_PASSWORD"])


def test_compose_refuses_to_start_without_the_database_password(env) -> None:
    loaded = yaml.safe_load(COMPOSE.read_text())
    for unset in ({k: v for k, v in env.items() if k != "POSTGRES_PASSWORD"}, {**env, "POSTGRES_PASSWORD": ""}):
        with pytest.raises(MissingVariable, match="POSTGRES_PASSWORD: set POSTGRES_PASSWORD in .env"):
            interpolate(loaded, unset)


def test_the_tokens_reach_the_services_as_secret_files_only(compose, env) -> None:
    services = compose["services"]
    assert compose["secrets"] == {"tuner_api_token": {"environment": "TUNER_API_TOKEN"},
                                  "ray_auth_token": {"environment": "RAY_AUTH_TOKEN"}}
    serve = argvs(services["tuner"]["command"])[-1]
    assert serve[serve.index("--token-file") + 1] == "/run/secrets/tuner_api_token"
    assert "tuner_api_token" in services["tuner"]["secrets"]
    # Every Ray node authenticates with the cluster's token, read from its secret file.
    ray_nodes = [s for s in services.values() if any(a[:2] == ["ray", "start"] for a in argvs(s.get("command", [])))]
    for node in ray_nodes:
        assert node["environment"]["RAY_AUTH_MODE"] == "token"
        assert node["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token"
        assert "ray_auth_token" in node["secrets"]
    shown = json.dumps([(s.get("command"), s.get("environment")) for s in services.values()])
    assert env["TUNER_API_TOKEN"] not in shown and env["RAY_AUTH_TOKEN"] not in shown


def test_every_service_is_health_checked_and_waits_for_healthy_dependencies(compose) -> None:
    services = compose["services"]
    for name, service in services.items():
        check = service.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name} has no health check"
        for dependency, how in service.get("depends_on", {}).items():
            assert how == {"condition": "service_healthy"}, (name, dependency)
            assert dependency in services
    # The service starts only once the database and the cluster answer.
    assert set(services["tuner"]["depends_on"]) == {"postgres", "ray-head"}


def test_named_volumes_keep_the_database_and_artifacts_and_every_ray_node_sees_the_same_paths(compose) -> None:
    services = compose["services"]
    assert set(compose["volumes"]) == {"postgres-data", "artifacts"}
    assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    ray_nodes = [s for s in services.values() if any(a[:2] == ["ray", "start"] for a in argvs(s.get("command", [])))]
    assert len(ray_nodes) == 3
    for node in ray_nodes:
        assert node["volumes"] == ray_nodes[0]["volumes"]
    artifacts = "artifacts:" + compose["x-tuner-environment"]["TUNER_ARTIFACTS"]
    assert artifacts in ray_nodes[0]["volumes"] and artifacts in services["dashboard"]["volumes"]
    for volume in (v.split(":")[0] for s in services.values() for v in s.get("volumes", [])):
        assert volume.startswith(("./", "/")) or volume in compose["volumes"], f"undeclared volume {volume}"


def test_the_gpu_worker_reserves_the_hosts_nvidia_gpus(compose) -> None:
    devices = compose["services"]["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def _option(argv: list[str], name: str) -> str:
    for i, token in enumerate(argv):
        if token == name:
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    raise AssertionError(f"{name} not in {argv}")


def test_published_ports_and_health_checks_name_the_ports_the_commands_listen_on(compose) -> None:
    services = compose["services"]
    serve = argvs(services["tuner"]["command"])[-1]
    dashboard = argvs(services["dashboard"]["command"])[0]
    # Ray Serve's proxy runs on the head node: the head publishes the API port `tuner serve` asks for.
    assert {p.rsplit(":", 1)[1] for p in services["ray-head"]["ports"]} == {
        _option(serve, "--port"), _option(argvs(services["ray-head"]["command"])[0], "--dashboard-port")}
    assert urlsplit(services["tuner"]["healthcheck"]["test"][-1]).port == int(_option(serve, "--port"))
    assert services["dashboard"]["ports"][0].rsplit(":", 1)[1] == _option(dashboard, "--port")
    assert urlsplit(services["dashboard"]["healthcheck"]["test"][-1]).port == int(_option(dashboard, "--port"))
    head = _option(argvs(services["ray-head"]["command"])[0], "--port")
    for node in ("tuner", "ray-gpu-worker"):
        assert _option(argvs(services[node]["command"])[0], "--address") == f"ray-head:{head}"
    assert _option(serve, "--ray-address") == f"ray-head:{head}"


# --- every command exists ---------------------------------------------------------------------------------


# Typer vendors its own copy of click: its commands and usage errors are of other classes than Ray's.
USAGE_ERRORS = (click.UsageError, typer.BadParameter.__base__)


def resolve_command(root, argv: list[str]):
    """The (sub)command `argv` names, its options parsed and type-checked as the CLI would parse them;
    AssertionError saying what is wrong if it would refuse them."""
    command, name, args = root, argv[0], argv[1:]
    while hasattr(command, "list_commands"):  # a group: the next word names a subcommand
        context = command.make_context(name, [], resilient_parsing=True)
        assert args, f"{' '.join(argv)}: names no subcommand"
        sub = command.get_command(context, args[0])
        assert sub is not None, f"{' '.join(argv)}: no subcommand {args[0]!r} (has {command.list_commands(context)})"
        command, name, args = sub, args[0], args[1:]
    try:
        command.make_context(name, list(args))
    except USAGE_ERRORS as exc:
        raise AssertionError(f"{' '.join(argv)}: {exc.format_message()}") from None
    return command


def check_runs(argv: list[str], environment: dict[str, str]) -> None:
    program = argv[0]
    if program == "tuner":
        from tuner.cli import app

        command = resolve_command(typer.main.get_command(app), argv)
        envvars = {p.envvar for p in command.params if p.envvar}
        unknown = {name for name in environment if name.startswith("TUNER_")} - envvars
        assert not unknown, f"{' '.join(argv[:2])} reads no {unknown}"
    elif program == "ray":
        from ray.scripts.scripts import cli

        resolve_command(cli, argv)
    elif program == "python3":
        assert argv[1] == "-c"
        compile(argv[2], "<health check>", "exec")
    elif program == "pg_isready":
        usage = subprocess.run([program, "--help"], capture_output=True, text=True, check=True).stdout
        for option in argv[1:]:
            assert re.search(rf"(^|\s){re.escape(option.split('=')[0])}[=\s]", usage, re.M), option
    else:
        raise AssertionError(f"a program this test does not know: {argv}")


@pytest.mark.parametrize("service", ["postgres", "ray-head", "tuner", "dashboard", "ray-gpu-worker"])
def test_every_command_a_service_runs_exists_with_its_options(compose, service: str) -> None:
    """`tuner ...` against the typer app (subcommand, options, values), `ray ...` against Ray's CLI."""
    spec = compose["services"][service]
    for argv in service_argvs(spec):
        check_runs(argv, spec.get("environment", {}))


def test_a_misspelt_option_value_or_subcommand_is_caught() -> None:
    from ray.scripts.scripts import cli
    from tuner.cli import app

    tuner = typer.main.get_command(app)
    with pytest.raises(AssertionError, match="No such option: --portt"):
        resolve_command(tuner, ["tuner", "dashboard", "--portt", "8080"])
    with pytest.raises(AssertionError, match="Invalid value for '--port'"):
        resolve_command(tuner, ["tuner", "dashboard", "--port", "eighty"])
    with pytest.raises(AssertionError, match="no subcommand 'serf'"):
        resolve_command(tuner, ["tuner", "serf"])
    with pytest.raises(AssertionError, match="names no subcommand"):
        resolve_command(tuner, ["tuner", "study"])
    with pytest.raises(AssertionError, match="No such option .--blok"):
        resolve_command(cli, ["ray", "start", "--blok"])


def test_the_dockerfile_copies_every_package_and_builds_on_the_same_vllm_image(compose, env) -> None:
    build = compose["x-tuner-image"]["build"]
    assert REPO / build["context"] / build["dockerfile"] == DOCKERFILE
    text = DOCKERFILE.read_text()
    copied = [p for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for p in line.split()]
    for path in copied:
        assert (REPO / path).exists(), path
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert packages == ["tuner", "tuner.*"]
    # The tuner package and the top-level folders of its package data (setup.py's DATA_FOLDERS).
    assert {"tuner", "storage", "search_spaces"} <= set(copied)
    assert {"pyproject.toml", "setup.py", "README.md"} <= set(copied)  # the build reads them
    default = re.search(r"^ARG VLLM_IMAGE=(\S+)$", text, re.M)[1]
    assert default == env["VLLM_IMAGE"] == build["args"]["VLLM_IMAGE"]
    assert default.startswith("vllm/vllm-openai:")
    assert re.search(r"^ENTRYPOINT \[\]$", text, re.M)  # the base image's is `vllm serve`


# --- the health checks, run against the real programs -----------------------------------------------------


def relocated(argv: list[str], moves: dict[str, str], used: set[str]) -> list[str]:
    """`argv` with hosts and ports moved (`ray-head` -> `127.0.0.1`, 6379 -> a free port): the deployment's
    fixed ports may be taken here. Records in `used` which moves applied."""
    def move(token: str) -> str:
        for old, new in moves.items():
            token, count = re.subn(rf"(?<![\w.-]){re.escape(old)}(?![\w-])", new, token)
            if count:
                used.add(old)
        return token

    return [move(token) for token in argv]


def probe(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a health check's command here (python3 is this interpreter)."""
    argv = [sys.executable, *argv[1:]] if argv[0] == "python3" else argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})})


def wait_healthy(argv: list[str], process: subprocess.Popen, timeout_s: float, env: dict | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe(argv, env)
        if result.returncode == 0:
            return
        assert process.poll() is None, f"{process.args[:3]} exited {process.returncode}"
        assert time.monotonic() < deadline, f"still unhealthy after {timeout_s} s: {result.stderr[-500:]}"
        time.sleep(1)


def stop_group(process: subprocess.Popen) -> None:
    """Stop a program started in a session of its own, with everything it started."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def processes_of(folder: Path) -> list[int]:
    """The processes whose command line names `folder` (each Ray process names its session folder)."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if str(folder) in " ".join(p.info["cmdline"] or [])]


def test_postgres_health_check_passes_against_a_running_server_and_fails_without_one(compose, postgres_url) -> None:
    check = service_argvs(compose["services"]["postgres"])[0]
    url = make_url(postgres_url)
    # In its container pg_isready reaches the server on its socket; here, on the test server's address.
    running = probe(check, {"PGHOST": url.host, "PGPORT": str(url.port)})
    assert running.returncode == 0, running.stdout + running.stderr
    assert probe(check, {"PGHOST": "127.0.0.1", "PGPORT": str(free_port())}).returncode != 0


def test_dashboard_health_check_passes_once_the_dashboard_serves(compose, postgres_database, tmp_path) -> None:
    service = compose["services"]["dashboard"]
    used: set[str] = set()
    moves = {"8080": str(free_port())}
    command, check = (relocated(argv, moves, used) for argv in service_argvs(service))
    assert used == set(moves)
    env = {**service["environment"], "TUNER_STORAGE": postgres_database, "TUNER_ARTIFACTS": str(tmp_path)}
    assert probe(check).returncode != 0
    process = subprocess.Popen([sys.executable, "-m", "tuner", *command[1:]], env={**os.environ, **env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(check, process, 60)
    finally:
        stop_group(process)


def test_ray_head_and_worker_health_checks_pass_once_each_node_is_up(compose) -> None:
    """The head and a worker started by their compose commands (ports moved, in a Ray temp folder of their own
    so that no other Ray on this machine finds them); each health check fails before its node is up."""
    services = compose["services"]
    head_port = str(free_port())
    moves = {"ray-head": "127.0.0.1", "6379": head_port, "8265": str(free_port()), "52365": str(free_port())}
    worker_moves = {**moves, "52365": str(free_port())}  # a second node on one machine needs its own agent port
    used: set[str] = set()
    head_command, head_check = (relocated(a, moves, used) for a in service_argvs(services["ray-head"]))
    worker_command, worker_check = (relocated(a, worker_moves, used) for a in service_argvs(services["ray-gpu-worker"]))
    assert used == set(moves)
    scratch = Path(tempfile.mkdtemp(prefix="rayhc-", dir="/tmp"))  # short: Ray's socket paths have a limit
    token_file = scratch / "ray_auth_token"
    token_file.write_text(secrets.token_hex(32))
    # The nodes' environment (token authentication), the token file they share moved here.
    ray_env = {**os.environ, **services["ray-gpu-worker"]["environment"], "RAY_AUTH_TOKEN_PATH": str(token_file),
               "RAY_TMPDIR": str(scratch)}
    ray = str(Path(sys.executable).with_name("ray"))
    # The compose file leaves Ray's client server on its default port, which another Ray here may hold.
    head_command += [f"--ray-client-server-port={free_port()}"]
    assert probe(head_check).returncode != 0 and probe(worker_check).returncode != 0
    started = []
    try:
        started.append(subprocess.Popen([ray, *head_command[1:]], env=ray_env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True))
        wait_healthy(head_check, started[0], 180)
        assert probe(worker_check).returncode != 0
        started.append(subprocess.Popen([ray, *worker_command[1:]], env=ray_env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True))
        wait_healthy(worker_check, started[1], 180)
        assert len(processes_of(scratch)) > 2  # what is looked for below is found while they run
    finally:
        for process in reversed(started):
            stop_group(process)
    time.sleep(2)
    assert processes_of(scratch) == [], "Ray processes left behind"
    shutil.rmtree(scratch)
