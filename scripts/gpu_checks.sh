#!/usr/bin/env bash
# Every GPU check in one call (run on the device machine from the repository root):
# the whole test suite compiled for the GPU on CUDA tensors, `gpu` tests included,
# then `tritongrad demo`. Logs go to $OUT when it is set.
set -uo pipefail
OUT=${OUT:-/tmp}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
markers=${MARKERS:-"not gpu2"}
python3 -m pytest -q -p no:cacheprovider -m "$markers" --maxfail=25 --tb=line "$@" 2>&1 | tee "$OUT/pytest.log" | tail -40
python3 -m tritongrad demo 2>&1 | tee "$OUT/demo.log" | tail -25
