#!/usr/bin/env bash
# Two CPU engines started at once, as the test suite's two xdist workers start them, under each way of placing
# them named in VARIANTS (default "pinned auto"):
#   auto    vLLM's automatic binding: both workers on core 0, core 1 left to the front ends;
#   pinned  one core each (VLLM_CPU_OMP_THREADS_BIND=0 and =1);
#   nobind  no binding at all, one OpenMP thread each (VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=1): the
#           kernel places every process of both engines;
#   inproc  vLLM's automatic binding, with the worker inside the engine core process
#           (VLLM_ENABLE_V1_MULTIPROCESSING=0): two processes an engine, not three, as on a GPU;
#   inproc1 the same, one OpenMP thread each (OMP_NUM_THREADS=1), as the tests run their engines.
# Each engine is a `tuner trial run` of REQUESTS requests (default 8) arriving at once; ROUNDS rounds (default 3),
# the variants' order rotated each round. Prints each run's startup, replay and teardown seconds.
#   usage: benchmarks/engine_binding.sh OUT_DIR
set -euo pipefail
out=$1 requests=${REQUESTS:-8}
read -r -a variants <<< "${VARIANTS:-pinned auto}"
mkdir -p "$out"
one() { # tag, then the environment that places the engine
  local tag=$1; shift
  env "$@" TUNER_HOME="$out/home" .venv/bin/tuner trial run \
    --trace tuner/data/traces/azure_conv_2023_first1000.csv --max-requests "$requests" --rate-scale 100 --fit clip \
    --load fixed --limit ttft_p95_s=none --limit e2e_p95_s=none --set max_model_len=1024 --set enforce_eager=true \
    --set kv_cache_memory_bytes=268435456 --set max_num_seqs=16 --out "$out/$tag" --json > "$out/$tag.json" 2> "$out/$tag.err"
}
both() { # tag, round, then the environment both engines share
  local tag=$1 round=$2; shift 2
  one "$tag-a-$round" "$@" & one "$tag-b-$round" "$@" & wait
}
pair() { # variant, round
  case $1 in
    auto) both auto "$2" ;;
    pinned) one "pin-a-$2" VLLM_CPU_OMP_THREADS_BIND=0 VLLM_CPU_NUM_OF_RESERVED_CPU=0 &
            one "pin-b-$2" VLLM_CPU_OMP_THREADS_BIND=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 & wait ;;
    nobind) both nobind "$2" VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 ;;
    inproc) both inproc "$2" VLLM_ENABLE_V1_MULTIPROCESSING=0 ;;
    inproc1) both inproc1 "$2" VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 ;;
    *) echo "unknown variant: $1 (auto, pinned, nobind, inproc, inproc1)" >&2; exit 2 ;;
  esac
}
n=${#variants[@]}
for round in $(seq "${ROUNDS:-3}"); do
  for i in $(seq 0 $((n - 1))); do pair "${variants[$(((i + round - 1) % n))]}" "$round"; done
done
for f in "$out"/*.json; do
  .venv/bin/python -c "import json, sys; t = json.load(open(sys.argv[1]))['timings']
print(sys.argv[1].rsplit('/', 1)[1], *(round(t[k], 1) for k in ('startup_s', 'replay_s', 'teardown_s')))" "$f"
done
