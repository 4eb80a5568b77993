#!/usr/bin/env bash
# The virtual environment the ONNX export spec (spec/onnx_spec.lua) runs onnx.checker and ONNX
# Runtime in: created once from PyPI (onnx, onnxruntime, numpy) under ~/.cache, used by the tests
# only. Prints its python; exits non-zero when it cannot be made (the spec is then skipped with a
# message).
#   py=$(bash tools/setup_onnx_venv.sh) && "$py" spec/onnx_check.py model.onnx x.bin y.bin
set -euo pipefail
venv=${LUMEN_ONNX_VENV:-$HOME/.cache/lumen-onnx-test}
# one maker at a time: .ci/run runs spec/onnx_spec.lua in two passes at once, and two pip installs
# into one new venv would break each other (the second waits, then finds it made)
mkdir -p "$(dirname "$venv")"
if command -v flock >/dev/null 2>&1; then
  exec 9> "$venv.lock"
  flock 9
fi
if ! "$venv/bin/python" -c "import onnx, onnxruntime, numpy" >/dev/null 2>&1; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q onnx onnxruntime numpy >&2
  "$venv/bin/python" -c "import onnx, onnxruntime, numpy" >&2
fi
echo "$venv/bin/python"
