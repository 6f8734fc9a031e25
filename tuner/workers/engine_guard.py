"""The first processes of every engine's group: they run the vLLM server and, when the process that launched
it dies (a killed driver or Ray worker) or they are told to stop, take the whole group down with them.

vLLM's server stops its engine-core processes when it shuts down cleanly, not when it is killed outright. And
a Ray worker that dies has its direct children SIGKILLed, which leaves no handler a chance. So the guard is
two processes: an outer one, the launcher's child (which may be killed outright), and an inner one, its child,
told by the kernel when the outer one dies, which then stops every member of the group.

    python -m tuner.workers.engine_guard VLLM_ARGV...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from tuner.workers.process_group import terminate_group
from tuner.workers.tied import tied_to_this_thread

GRACE_S = 10.0
_INNER = "--inner"


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def _outer(argv: list[str]) -> int:
    inner = subprocess.Popen(tied_to_this_thread([sys.executable, "-m", "tuner.workers.engine_guard", _INNER, *argv]))

    def forward(signum, frame) -> None:
        inner.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return _exit_code(inner.wait())


def _inner(argv: list[str]) -> int:
    server = subprocess.Popen(argv)
    pgid = os.getpgid(0)
    # The outer guard waits for this one: stopping it too would only make both wait out the grace period.
    guards = (os.getpid(), os.getppid())
    stopping = threading.Event()

    def stop(signum, frame) -> None:
        # Only signals here: waiting inside a handler would contend with the main thread's wait below.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the outer guard forwards the group's SIGTERM here too
        stopping.set()
        server.terminate()  # the server first, so that it shuts its engine down the way vLLM does
        deadline = threading.Timer(GRACE_S, terminate_group, (pgid, GRACE_S, guards))
        deadline.daemon = True  # must not hold the guard's exit once the server is gone
        deadline.start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = server.wait()
    # Stopped, or ended on its own (crash, refusal at start): nothing the server started may outlive it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    terminate_group(pgid, GRACE_S, spare=guards)
    return 128 + signal.SIGTERM if stopping.is_set() else _exit_code(code)


def main() -> int:
    """The guard's entry point (argv: the server's command line), started tied to its launcher: runs the server
    under the two guards and returns its exit status (128 + N for signal N; 128 + SIGTERM when told to stop)."""
    if sys.argv[1:2] == [_INNER]:
        return _inner(sys.argv[2:])
    return _outer(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
