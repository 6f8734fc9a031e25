# What every GPU study script shares: the staged install, the environment, the study's state carried from an
# earlier machine, the records packed at exit, and the background job that outlives one call. Sourced, with
#   tag   the tarball's name ($OUT/$tag.tar.gz, .gpu-state/$tag.tar.gz) and the home folder (/tmp/$tag)
#   db    the study database's file name in the home folder (default study.db)
#   name  the study, named for the GPU model, so an H100 and an H200 never share one (set after sourcing: $gpu
#         is known then)
# A machine can be taken back mid-run: put the last tarball that came back into .gpu-state/ and carry that folder
# too; a fresh machine of the same GPU model then goes on with the study where it stopped (a trial cut off is
# re-run). A validation cut off leaves its remaining launches queued in the study: `wait` after carrying the state
# back does not run them; `python3 -m tuner study run NAME --trials K --no-validate` (K launches left) does.
[ -d /tmp/site/vllm ] || bash /tmp/stage/install.sh >/dev/null
home=/tmp/$tag out=/tmp/$tag/out db=${db:-study.db}
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 TUNER_HOME=$home PYTHONUNBUFFERED=1
export TUNER_STORAGE=sqlite:///$home/$db TUNER_ARTIFACTS=$home/artifacts
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
tuner() { python3 -m tuner "$@"; }
if [ ! -e "$home/$db" ] && [ -f ".gpu-state/$tag.tar.gz" ]; then
  mkdir -p "$home" && tar -xzf ".gpu-state/$tag.tar.gz" -C "$home"
  grep -q "$gpu" "$home/out/nvidia-smi.csv" || { echo "the carried study ran on another GPU model" >&2; exit 2; }
fi
mkdir -p "$out"
pack() {
  tuner study status "${name:-}" --json > "$out/status.json" 2>/dev/null || true
  tuner study best "${name:-}" > "$out/best.txt" 2>&1 || true
  tuner study best "${name:-}" --json > "$out/best.json" 2>/dev/null || true
  tuner study export "${name:-}" --out "$out/export.json" >/dev/null 2>&1 || true
  tar -czf "${OUT:-/tmp}/$tag.tar.gz" -C "$home" "$db" out artifacts/trials 2>/dev/null || true
}
trap pack EXIT
# The GPU's name and memory once, and its use every 5 s for as long as the machine stays warm.
watch_gpu() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/nvidia-smi.csv"
  pgrep -f "nvidia-smi --query-gpu=timestamp" > /dev/null ||
    setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 \
      >> "$out/gpu-use.csv" 2>/dev/null < /dev/null &
}
# In the background, in its own session: outlives this call while the machine stays warm.
detach() { setsid nohup "$@" < /dev/null & echo $! > "$home/running.pid"; }
# Waits at most WAIT_S seconds (default 300, the most a machine taken back loses) for what detach started.
wait_running() {
  local deadline=$((SECONDS + ${WAIT_S:-300})) pid
  pid=$(cat "$home/running.pid" 2>/dev/null) || return 0
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 5; done
  if kill -0 "$pid" 2>/dev/null; then echo "still running"; else echo "finished"; fi
  tail -n 5 "$out"/*.log 2>/dev/null || true
}
# The best trial against vLLM's default, 2 launches each, in the background; then waits.
validate_study() {
  detach bash -c "python3 -m tuner study validate $name --repeats 2 --json > $out/validate.json 2> $out/validate.log"
  wait_running
}
