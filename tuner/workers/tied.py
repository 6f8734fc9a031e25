"""Children that the kernel stops when the thread that started them exits, however it exits (even by SIGKILL).

The child arms this itself, in a small wrapper that then execs the real command. Arming it in a preexec_fn
instead makes subprocess fork the launcher rather than vfork it, and a fork runs every at-fork handler the
launcher's libraries registered: in a Ray worker or Serve replica, grpc's handler once aborted a child before it
could exec, and the abort's alarm then killed the command it went on to exec.

    python -m tuner.workers.tied LAUNCHER_PID SIGNAL COMMAND...
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tied_to_this_thread(argv: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """`argv` wrapped so that its process receives `sig` when the thread that starts it exits."""
    return [sys.executable, "-m", "tuner.workers.tied", str(os.getpid()), str(int(sig)), *argv]


def main(args: list[str]) -> int:
    """Arm the signal, then exec the command; 1 without running it if the launcher died before it was armed."""
    launcher, sig, command = int(args[0]), int(args[1]), args[2:]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != launcher:
        return 1
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
