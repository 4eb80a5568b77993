#!/usr/bin/env bash
# bench/amp_accuracy.sh -- bf16-autocast ResNet50 logits, lumen beside PyTorch 2.x, against
# float64: tools/amp_accuracy.py writes weights, input and PyTorch's logits into $OUT (default
# /tmp/lumen-amp-acc), then tools/amp_accuracy.lua computes lumen's and prints the ratios.
set -eu
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/lumen-amp-acc}
py=${PEER2_PY:-$(bash ../shared/peer/setup_torch2.sh)}
"$py" tools/amp_accuracy.py "$out"
bin/lumen tools/amp_accuracy.lua "$out"
