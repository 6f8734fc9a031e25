"""Stopping an engine's whole process group, whoever its members are by now."""

from __future__ import annotations

import contextlib
import os

import psutil


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie: a zombie has exited, whether or not its new parent has reaped it yet."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes of group `pgid` still running (zombies left out); those that cannot be read are skipped."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == pgid and _running(proc):
                members.append(proc)
    return members


def terminate_group(pgid: int, grace_s: float, spare: tuple[int, ...] = ()) -> None:
    """SIGTERM every member of the group but those in `spare`, wait up to grace_s, then SIGKILL what is left.

    Members are found by group id, not by parentage: an engine-core process whose server was killed outright
    has a new parent but is still in the group. A member that is the caller's child is reaped here: spare one
    whose exit code a subprocess.Popen must still read."""
    members = [p for p in group_members(pgid) if p.pid not in spare]
    for proc in members:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(members, timeout=grace_s)
    for proc in alive + [p for p in group_members(pgid) if p.pid not in spare and p not in members]:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
