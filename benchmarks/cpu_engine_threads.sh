#!/usr/bin/env bash
# The main job's default trial (vLLM's default configuration of the cpu-small space, on the demo's workload: the
# bundled trace's first 16 requests at six times their rate, its load searched at 25% precision) launched by
# `tuner trial run`, idle and with one core kept busy by another process, under each way of starting the CPU engine
# named in VARIANTS (default "vllm tuner"):
#   vllm   as vLLM starts itself: API server, engine core and worker, the worker's OpenMP threads bound by vLLM
#          (VLLM_ENABLE_V1_MULTIPROCESSING=1 set, so that tuner leaves every thread variable to vLLM);
#   tuner  as tuner launches a CPU engine (tuner/workers/cpu_engine.py): the worker inside the engine core, on half the
#          usable cores (one here), unbound.
# ROUNDS rounds (default 2), the order of the four runs rotated each round. Prints one line a run: variant, idle or
# busy, startup s, replay s, capacity req/s, and the reference probe's p50 time per output token in ms.
#   usage: benchmarks/cpu_engine_threads.sh OUT_DIR
set -euo pipefail
out=$1
read -r -a variants <<< "${VARIANTS:-vllm tuner}"
mkdir -p "$out"
one() { # tag, then the environment
  local tag=$1; shift
  env "$@" TUNER_HOME="$out/home" .venv/bin/tuner trial run --max-requests 16 --rate-scale 6 --fit clip \
    --precision 0.25 --probe-seconds 10 --set enforce_eager=true --set max_model_len=1024 \
    --set kv_cache_memory_bytes=268435456 --set enable_chunked_prefill=true \
    --out "$out/$tag" --json > "$out/$tag.json" 2> "$out/$tag.err"
}
run() { # variant, load (idle or busy), round
  local env=()
  [ "$1" = vllm ] && env=(VLLM_ENABLE_V1_MULTIPROCESSING=1)
  if [ "$2" = busy ]; then
    python3 -c 'while True: pass' & local hog=$!
    one "$1-$2-$3" "${env[@]}" || true
    kill "$hog"
  else
    one "$1-$2-$3" "${env[@]}" || true
  fi
}
[ -d "$out/home/models/tiny" ] || TUNER_HOME="$out/home" .venv/bin/tuner model tiny "$out/home/models/tiny" > /dev/null
combos=()
for v in "${variants[@]}"; do combos+=("$v idle" "$v busy"); done
n=${#combos[@]}
for round in $(seq "${ROUNDS:-2}"); do
  for i in $(seq 0 $((n - 1))); do
    read -r variant load <<< "${combos[$(((i + round - 1) % n))]}"
    run "$variant" "$load" "$round"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        t = json.loads(f.read_text())
    except ValueError:
        print(f.stem, "failed: see", f.with_suffix(".err")); continue
    timings, cap = t["timings"], t.get("capacity") or {}
    ref = next(p for p in t["probes"] if p["index"] == 0)["measurement"]
    tpot = (ref.get("tpot_s") or {}).get("p50")
    print(f.stem, round(timings["startup_s"], 1), round(timings["replay_s"], 1), cap.get("rps"),
          round(tpot * 1000, 1) if tpot else None)
PY
