#!/usr/bin/env bash
# The product itself on one H200: a real study (Ray worker on the GPU, SQLite) of Llama-3.1-8B with dummy
# weights against the bundled cut of the Azure 2023 conversation trace, then `tuner compare` at two
# max_num_seqs. Run on the GPU machine from the repository root, after the wheels were staged into
# /tmp/stage (../shared/gpu/README.md):  bash benchmarks/gpu/h200_llama8b.sh study|more|compare
# Each phase fits one 10-minute call; /tmp survives between calls while the machine stays warm. Every phase
# leaves what it has so far in $OUT/h200-llama8b.tar.gz. STUDY_S / MORE_S: seconds of trials each phase starts.
set -euo pipefail
phase=$1
[ -d /tmp/site/vllm ] || bash /tmp/stage/install.sh >/dev/null
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 TUNER_HOME=/tmp/tuner-home PYTHONUNBUFFERED=1
export TUNER_STORAGE=sqlite:////tmp/tuner-home/h200.db TUNER_ARTIFACTS=/tmp/tuner-home/artifacts
model=/tmp/models/llama-3.1-8b
tuner() { python3 -m tuner "$@"; }
out=/tmp/tuner-home/out
mkdir -p "$out"
pack() { tar -czf "${OUT:-/tmp}/h200-llama8b.tar.gz" -C /tmp/tuner-home h200.db out artifacts/trials 2>/dev/null || true; }
trap pack EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/nvidia-smi.csv"
case $phase in
  study)
    tuner model arch llama-3.1-8b "$model"
    # All 1,000 requests of the bundled cut at 4.5 times their recorded rate: 20.8 req/s offered for 48 s,
    # where vLLM's default configuration (eager) nears its knee (600 requests at 16 req/s, on 2026-12-02, put it
    # under no pressure).
    tuner study create h200-llama8b --model "$model" --space h200-llama8b --boundary interactive \
      --rate-scale 4.5 --seed 0 --startup-timeout 400 --request-timeout 300 | tee "$out/create.txt"
    tuner study run h200-llama8b --trials 12 --timeout "${STUDY_S:-420}" --json | tee "$out/run-1.json"
    ;;
  more)
    tuner study run h200-llama8b --trials 12 --timeout "${MORE_S:-480}" --json | tee "$out/run-2.json"
    ;;
  compare)
    tuner compare --model "$model" --max-requests 600 --rate-scale 4 --set dtype=bfloat16 \
      --set enforce_eager=true --set gpu_memory_utilization=0.2 --set max_model_len=8192 --vary max_num_seqs=32,256 \
      --startup-timeout 300 --request-timeout 300 --out "$out/compare" --json | tee "$out/compare.json"
    ;;
esac
tuner study status h200-llama8b --json > "$out/status.json" || true
tuner study best h200-llama8b > "$out/best.txt" 2>&1 || true
tuner study best h200-llama8b --json > "$out/best.json" 2>/dev/null || true
tuner study export h200-llama8b --out "$out/export.json" || true
