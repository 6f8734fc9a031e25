#!/usr/bin/env bash
# The product itself on one H200, as users run it: a capacity study (Ray worker on the GPU, SQLite) of
# Llama-3.1-8B with dummy weights on the production engine (CUDA graphs and torch.compile, no enforce_eager),
# then validation of its best against vLLM's default. Run on the GPU machine from the repository root, after
# the wheels were staged into /tmp/stage (../shared/gpu/README.md):
#   bash benchmarks/gpu/h200_llama8b.sh study      # create the study, start its trials in the background, wait
#   bash benchmarks/gpu/h200_llama8b.sh all        # the same, then the validation right after, in one background job
#   bash benchmarks/gpu/h200_llama8b.sh validate   # start the validation in the background, wait
#   bash benchmarks/gpu/h200_llama8b.sh wait       # wait again for what is running
#   SETTINGS="--set max_num_seqs=214 ..." RATE=5.9 bash benchmarks/gpu/h200_llama8b.sh longer
#                                                  # 1,000 requests at RATE x the trace's rate, one launch of
#                                                  # SETTINGS (vLLM's default without): a load probes cannot show
#   bash benchmarks/gpu/h200_llama8b.sh compare    # 2026-12-02's concurrency check (eager, as then)
#   bash benchmarks/gpu/h200_llama8b.sh budget     # issue 36: the same workload, the derived space with FP8
#                                                  # allowed, one run within BUDGET (default 20m) of GPU time,
#                                                  # validation included, in the background; then waits
#                                                  # (PROBE_REQUESTS, PROBE_SECONDS: shorter probes than 300, 8 s)
#   bash benchmarks/gpu/h200_llama8b.sh budget-rest  # the budget study carried in .gpu-state/: TRIALS (default 1)
#                                                  # more trials, then the validation, unbudgeted, in the background
#   bash benchmarks/gpu/h200_llama8b.sh budget-aa  # the budget study carried in .gpu-state/: an A/A check of vLLM's
#                                                  # default, paired where sleep mode serves, in the background
#   bash benchmarks/gpu/h200_llama8b.sh budget-wait  # wait again for the budget study's run (packs its records)
# The trials and the validation run in their own session (setsid), so they go on between calls while the
# machine stays warm; each call waits at most WAIT_S seconds (default 300, the most a machine taken back loses),
# then leaves everything so far in $OUT/h200-llama8b.tar.gz. TRIALS: trials the study runs (default 5, vLLM's
# default among them).
# A machine taken back mid-run: benchmarks/gpu/common.sh says how the study goes on on another.
set -euo pipefail
phase=$1 tag=h200-llama8b db=h200.db
# shellcheck source=benchmarks/gpu/common.sh
source "$(dirname "$0")/common.sh"
case $gpu in
  # The reference load: the first 300 requests of the bundled cut at this many times their recorded rate
  # (3.57 req/s), where vLLM's default is busy but inside the boundary. On an H100 it carried 13.8 req/s
  # (2026-12-05); on the H200 19.8 req/s of this trace held p95 TTFT 0.33 s and p95 end-to-end 10.3 s (2026-12-03).
  *H100*) name=h100-llama8b-prod scale=${RATE_SCALE:-3.5} ;;
  *) name=h200-llama8b-prod scale=${RATE_SCALE:-5} ;;
esac
model=/tmp/models/llama-3.1-8b
# STUDY: another name for the budget study (a new occasion's own, beside the records of earlier ones).
case $phase in budget*) name=${STUDY:-${name%-prod}-fp8-budget} ;; esac
# These go on with a study carried from an earlier machine: without it, a tuner command would create an empty
# database here, and the carried one would then never be unpacked over it.
case $phase in budget-rest|budget-aa)
  [ -e "$home/$db" ] || { trap - EXIT; echo "$phase: no study carried: carry .gpu-state/$tag.tar.gz" >&2; exit 2; } ;;
esac
case $phase in
  study|all)
    watch_gpu
    tuner model arch llama-3.1-8b "$model"
    # Probes of at least 8 s (300 requests at the reference load) keep a trial to minutes.
    tuner study status "$name" > /dev/null 2>&1 ||
      tuner study create "$name" --model "$model" --space h200-llama8b --boundary interactive \
        --max-requests 300 --rate-scale "$scale" --probe-requests 300 --probe-seconds 8 --probe-budget 5 \
        --seed 0 --startup-timeout 400 --request-timeout 300 | tee "$out/create.txt"
    then=true
    [ "$phase" = all ] && then="python3 -m tuner study validate $name --repeats 2 --json > $out/validate.json \
      2> $out/validate.log"
    detach bash -c "python3 -m tuner study run $name --trials ${TRIALS:-5} --no-validate --json \
      > $out/run-study.json 2> $out/run-study.log; $then"
    wait_running
    ;;
  budget)
    watch_gpu
    tuner model arch llama-3.1-8b "$model"
    tuner study status "$name" > /dev/null 2>&1 ||
      tuner study create "$name" --model "$model" --space auto --allow-fp8 --boundary interactive \
        --max-requests 300 --rate-scale "$scale" --probe-requests "${PROBE_REQUESTS:-300}" \
        --probe-seconds "${PROBE_SECONDS:-8}" --probe-budget 5 --precision 0.1 \
        --seed 0 --startup-timeout 400 --request-timeout 300 | tee "$out/create.txt"
    detach bash -c "python3 -m tuner study run $name --budget ${BUDGET:-20m} --json > $out/run-budget.json \
      2> $out/run-budget.log"
    wait_running
    ;;
  budget-rest)
    watch_gpu
    tuner model arch llama-3.1-8b "$model"
    detach bash -c "python3 -m tuner study run $name --trials ${TRIALS:-1} --no-validate --json > $out/run-rest.json \
      2> $out/run-rest.log; python3 -m tuner study validate $name --repeats 2 --json > $out/validate.json \
      2> $out/validate.log"
    wait_running
    ;;
  budget-aa)
    watch_gpu
    tuner model arch llama-3.1-8b "$model"
    detach bash -c "python3 -m tuner study validate $name --against-itself --repeats 2 --json > $out/validate-aa.json \
      2> $out/validate-aa.log"
    wait_running
    ;;
  validate)
    validate_study
    ;;
  wait|budget-wait)
    wait_running
    ;;
  longer)
    # A probe's few hundred requests can pass a load near the engine's throughput; a longer replay at that load
    # tells whether it holds (BENCHMARKS.md, "Llama-3.1-8B on the production engine").
    # shellcheck disable=SC2086  # SETTINGS is a list of --set options, split on purpose
    tuner trial run --model "$model" --max-requests 1000 --rate-scale "${RATE:?RATE: the load, x the trace}" \
      --load fixed --boundary interactive --set dtype=bfloat16 ${SETTINGS:-} --startup-timeout 400 \
      --request-timeout 300 --out "$out/longer-$RATE" --json > "$out/longer-$RATE.json" 2> "$out/longer-$RATE.log"
    tail -n 3 "$out/longer-$RATE.log"
    ;;
  compare)
    tuner compare --model "$model" --max-requests 600 --rate-scale 4 --set dtype=bfloat16 \
      --set enforce_eager=true --set gpu_memory_utilization=0.2 --set max_model_len=8192 --vary max_num_seqs=32,256 \
      --startup-timeout 300 --request-timeout 300 --out "$out/compare" --json | tee "$out/compare.json"
    ;;
esac
