#!/usr/bin/env bash
# Two CPU engines started at once, as the test suite's two xdist workers start them: left to vLLM's automatic
# binding (both workers on core 0) against one core each (VLLM_CPU_OMP_THREADS_BIND). Each is a `tuner trial run`
# of REQUESTS requests (default 8) arriving at once; ROUNDS rounds (default 3), the order alternated. Prints each
# run's startup, replay and teardown seconds.   usage: benchmarks/engine_binding.sh OUT_DIR
set -euo pipefail
out=$1 requests=${REQUESTS:-8}
mkdir -p "$out"
one() { # tag, core ("" for vLLM's own binding)
  local env=()
  [ -n "$2" ] && env=(VLLM_CPU_OMP_THREADS_BIND="$2" VLLM_CPU_NUM_OF_RESERVED_CPU=0)
  env "${env[@]}" TUNER_HOME="$out/home" .venv/bin/tuner trial run \
    --trace tuner/data/traces/azure_conv_2023_first1000.csv --max-requests "$requests" --rate-scale 100 --fit clip \
    --load fixed --limit ttft_p95_s=none --limit e2e_p95_s=none --set max_model_len=1024 --set enforce_eager=true \
    --set kv_cache_memory_bytes=268435456 --set max_num_seqs=16 --out "$out/$1" --json > "$out/$1.json" 2> "$out/$1.err"
}
auto() { one "auto-a-$1" "" & one "auto-b-$1" "" & wait; }
pinned() { one "pin-a-$1" 0 & one "pin-b-$1" 1 & wait; }
for round in $(seq "${ROUNDS:-3}"); do
  if ((round % 2)); then pinned "$round"; auto "$round"; else auto "$round"; pinned "$round"; fi
done
for f in "$out"/*.json; do
  .venv/bin/python -c "import json, sys; t = json.load(open(sys.argv[1]))['timings']
print(sys.argv[1].rsplit('/', 1)[1], *(round(t[k], 1) for k in ('startup_s', 'replay_s', 'teardown_s')))" "$f"
done
