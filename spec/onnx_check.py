"""Checks ONNX files lumen exported and runs them in ONNX Runtime (spec/onnx_spec.lua).

    python spec/onnx_check.py MODEL.onnx INPUT.f32 OUTPUT.f32 [MODEL2.onnx ...]

For each triple: onnx.checker (full check, with shape inference) must pass; the input (raw
float32, the model's input sizes; a symbolic dim -- dynamic_axes -- takes what the file's size
leaves for it) is run on the CPU provider and the first output written as raw float32. Prints one
line per model, with the input's dims as the graph declares them (names for symbolic ones).
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort

args = sys.argv[1:]
for i in range(0, len(args), 3):
    path, xin, yout = args[i:i + 3]
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else -1 for d in inp.shape]
    x = np.fromfile(xin, dtype=np.float32).reshape(shape)
    y = sess.run(None, {inp.name: x})[0]
    y.astype(np.float32).tofile(yout)
    print("checked", path, "opset", model.opset_import[0].version, "input", list(inp.shape),
          "output", list(y.shape), "output dims", list(sess.get_outputs()[0].shape))
