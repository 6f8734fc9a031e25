#!/usr/bin/env bash
# Long-context pressure, as users meet it (issue 19): a capacity study of Qwen2.5-32B (dummy weights, bf16, 61 GiB)
# on one H200, production engine (CUDA graphs and torch.compile, no enforce_eager), replaying a window of the
# Mooncake conversation trace with its shared prefixes. Run on the GPU machine from the repository root, after the
# wheels were staged into /tmp/stage (../shared/gpu/README.md):
#   BOUNDARY=long-prompt bash benchmarks/gpu/h200_qwen32b_mooncake.sh study   # create, run TRIALS in the background
#   BOUNDARY=batch bash benchmarks/gpu/h200_qwen32b_mooncake.sh study         # the same under the batch boundary
#   BOUNDARY=... bash benchmarks/gpu/h200_qwen32b_mooncake.sh validate        # best against vLLM's default
#   bash benchmarks/gpu/h200_qwen32b_mooncake.sh wait                        # wait again for what is running
#   RATE=0.2 bash benchmarks/gpu/h200_qwen32b_mooncake.sh arrivals           # vLLM's default at RATE x the window's
#                       # rate, recorded against spread (tuner compare --vary arrivals): two launches; REQUESTS:
#                       # the window's first N (default 100)
# Each call waits at most WAIT_S seconds (default 300), then leaves everything so far in $OUT/h200-qwen32b.tar.gz.
# TRIALS: trials the study runs (default 5, vLLM's default among them). A machine taken back mid-run:
# benchmarks/gpu/common.sh says how the study goes on on another.
#
# The window: `tuner trace window ../shared/traces/mooncake_conversation_trace.jsonl --requests 100` finds the 100
# requests from 899.999 s, whose repeated prefix blocks (4.5%) are the median over every window of 100 (p10-p90
# 3.6%-6.0%; 36.6% over the whole hour, which a trial's empty cache never sees). It starts at a recorded instant, so
# the same 100 requests are replayed spread or bucketed. The shipped cut (traces/, 600 s to 1,200 s of the trace)
# starts at 600 s, so the window starts at 299.999 s in it. It offers 3.11 req/s (spread); prompts p50 9,651 and p95
# 50,624 tokens, lengths over a trial's max_model_len clipped (reported, and the traffic carried whole is ranked).
set -euo pipefail
phase=$1 tag=h200-qwen32b boundary=${BOUNDARY:-long-prompt}
# shellcheck source=benchmarks/gpu/common.sh
source "$(dirname "$0")/common.sh"
case $gpu in
  *H100*) name=h100-qwen32b-$boundary ;;
  *) name=h200-qwen32b-$boundary ;;
esac
# The reference load, x the window's 3.11 req/s: 0.31 req/s. On 2026-12-03 vLLM's default on the H200 broke the
# long-prompt boundary at 0.6 req/s of the trace's first 60 requests, bucketed (p95 TTFT 22 s, prompts ~12k tokens).
scale=${RATE_SCALE:-0.1}
model=/tmp/models/qwen2.5-32b
trace=benchmarks/gpu/traces/mooncake_conversation_600-1200s.jsonl
window=(--trace "$trace" --window 299.999: --fit clip)
case $phase in
  study)
    watch_gpu
    tuner model arch qwen2.5-32b "$model"
    # 40 requests a probe, at least 60 s of arrivals: a prompt of 12k tokens takes about a second of prefill, so a
    # probe of 80 at a third of a request a second would take 4 minutes of the session's 30.
    tuner study status "$name" > /dev/null 2>&1 ||
      tuner study create "$name" --model "$model" "${window[@]}" --max-requests 100 --spread --space auto \
        --boundary "$boundary" \
        --rate-scale "$scale" --probe-requests 40 --probe-seconds 60 --probe-budget 4 \
        --seed 0 --startup-timeout 600 --request-timeout 600 | tee "$out/create-$boundary.txt"
    detach bash -c "python3 -m tuner study run $name --trials ${TRIALS:-5} --no-validate --json \
      > $out/run-$boundary.json 2> $out/run-$boundary.log"
    wait_running
    ;;
  validate)
    validate_study
    ;;
  wait)
    wait_running
    ;;
  arrivals)
    # `tuner compare` replays the window's same requests as recorded and spread, one launch of vLLM's default each.
    watch_gpu
    tuner model arch qwen2.5-32b "$model"
    rate=${RATE:?RATE: the load, x the window\'s rate}
    detach python3 -m tuner compare --model "$model" "${window[@]}" --max-requests "${REQUESTS:-100}" \
      --rate-scale "$rate" --load fixed \
      --vary arrivals=recorded,spread --boundary "$boundary" --set dtype=bfloat16 --startup-timeout 600 \
      --request-timeout 600 --out "$out/arrivals-$rate" --json > "$out/arrivals-$rate.json" 2> "$out/arrivals-$rate.log"
    wait_running
    ;;
esac
