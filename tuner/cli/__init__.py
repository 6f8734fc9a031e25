"""The `tuner` command line: tables for people, --json for programs, exit 2 for bad usage.

One module per command group; `options` declares the options they share, `present` states trials and
recommendations to people."""

from __future__ import annotations

import signal
import sys

import typer

from tuner.cli.model import model_app
from tuner.cli.report import compare, study_report
from tuner.cli.schedule import schedule_app
from tuner.cli.service import dashboard, serve
from tuner.cli.space import space_app
from tuner.cli.study import study_app
from tuner.cli.trace import trace_app
from tuner.cli.trial import trial_app
from tuner.common.console import err
from tuner.common.errors import TunerError

app = typer.Typer(help="Find the vLLM engine settings that serve your own traffic best, by measuring them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
app.add_typer(model_app, name="model")
app.add_typer(trace_app, name="trace")
app.add_typer(trial_app, name="trial")
app.add_typer(space_app, name="space")
app.add_typer(study_app, name="study")
app.add_typer(schedule_app, name="schedule")
app.command("dashboard")(dashboard)
study_app.command("report")(study_report)
app.command("compare")(compare)
app.command("serve")(serve)


def _stop_on_sigterm(signum, frame) -> None:
    # Turn a polite kill into the same unwinding as Ctrl-C, so every engine is stopped on the way out.
    raise KeyboardInterrupt


# The exceptions of the click typer runs on (its own copy in recent typer): a usage error is one of them.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _print_error(message: str) -> None:
    """One line, always: a line break inside a quoted path or value is shown as \\n."""
    err.print(f"error: {message}".replace("\r", "\\r").replace("\n", "\\n"), highlight=False, soft_wrap=True)


def main() -> None:
    """Run the command line and exit: 0 done, 1 the work failed, 2 bad usage or input (one line on stderr),
    130 interrupted (SIGINT or SIGTERM)."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        # Not standalone: a usage error comes here as one line, rather than as typer's boxed, wrapped panel.
        code = app(standalone_mode=False)
    except _ClickException as exc:
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _print_error(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    except TunerError as exc:
        _print_error(str(exc))
        sys.exit(2)
    except OSError as exc:  # a path given that cannot be written or read: "[Errno 17] File exists: 'x'"
        _print_error(str(exc))
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted: every engine was stopped")
        sys.exit(130)
    # A command's typer.Exit(N) comes back as N; a command that returned normally exits 0.
    sys.exit(code if isinstance(code, int) else 0)
