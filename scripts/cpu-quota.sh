#!/usr/bin/env bash
# Run a command as on a slower machine: in a cgroup of its own whose CPU time is capped at CORES cores' worth
# (0.2 = a fifth of one core), everything it starts included. cgroup v2's cpu.max where the machine has it, else
# cgroup v1's cpu.cfs_quota_us; needs root. The cgroup is removed afterwards.
#   scripts/cpu-quota.sh 0.2 .venv/bin/tuner study run demo --trials 2
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/cpu-quota.sh CORES COMMAND [ARG...]" >&2
  exit 2
fi
cores=$1; shift
period=100000
quota=$(python3 -c "import sys; q = float(sys.argv[1]); assert q > 0; print(int(q * $period))" "$cores" 2>/dev/null) || {
  echo "CORES must be a positive number, got $cores" >&2; exit 2; }
name="tuner-quota-$$"
if [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  group=/sys/fs/cgroup/$name
  mkdir "$group" && echo "$quota $period" > "$group/cpu.max"
elif [ -d /sys/fs/cgroup/cpu ] && [ -w /sys/fs/cgroup/cpu ]; then
  group=/sys/fs/cgroup/cpu/$name
  mkdir "$group" && echo "$period" > "$group/cpu.cfs_period_us" && echo "$quota" > "$group/cpu.cfs_quota_us"
else
  echo "no writable cgroup CPU controller here (run as root on Linux)" >&2
  exit 2
fi
cleanup() {
  # Whatever is left of the command goes back to the parent group, so that the group can be removed.
  for pid in $(cat "$group/cgroup.procs" 2>/dev/null); do echo "$pid" > "$(dirname "$group")/cgroup.procs" 2>/dev/null; done
  rmdir "$group" 2>/dev/null
}
trap cleanup EXIT
echo "$$" > "$group/cgroup.procs"
"$@"
