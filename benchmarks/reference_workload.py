"""A fixed reference workload, to tell the machine's speed from certify's (issue 42).

`certify demo`'s wall time moves with the host (20-40% from day to day on the project's shared
2-core machine). Run this beside the demo, in the same session: the ratio demo / reference is
what to compare across days. The workload is what the demo spends its time on, in fixed
amounts: onnxruntime inference of the demo's standard model on the demo's signs, and forward
and backward passes of the same network's torch copy, on the threads certify uses on the CPU.

``.venv/bin/python benchmarks/reference_workload.py [--rounds 3]``: prints the best round's
seconds (and each round's) as JSON.

The yardstick must not move with certify's own speed: the torch copy here is built from the
demo graph with every MaxPool naming its Indices output, so its passes do the work the copy did
before issue 66 (which computes Indices only where a graph reads them), whatever certify's copy
skips today. Any later change to the copy's converters that would speed this workload up is
pinned the same way, or said in benchmarks/RESULTS.md with the yardstick's old and new times.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
from certify.demo.synthetic import generate
from certify.models.base import Preprocessing
from certify.models.torchcopy import TorchCopy

#: Fixed amounts: images through onnxruntime, and forward + backward passes of batches of 64.
ORT_PASSES = 20
GRAD_STEPS = 80


def workload(x: np.ndarray, sess: ort.InferenceSession, copy: TorchCopy) -> float:
    """Seconds for one round of the fixed work."""
    name = sess.get_inputs()[0].name
    xt = torch.from_numpy(x[:64])
    y = torch.zeros(64, dtype=torch.long)
    t0 = time.perf_counter()
    for _ in range(ORT_PASSES):
        for s in range(0, len(x), 256):
            sess.run(None, {name: x[s : s + 256]})
    for _ in range(GRAD_STEPS):
        copy.value_and_grad(xt, lambda z: torch.nn.functional.cross_entropy(
            z, y, reduction="none"))
    return time.perf_counter() - t0


def pinned_graph(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every MaxPool naming its Indices output (unread): the torch copy's work
    as before issue 66, so that the yardstick stays fixed (see the module's docstring)."""
    for node in proto.graph.node:
        if node.op_type == "MaxPool" and len(node.output) == 1:
            node.output.append(f"{node.output[0]}__indices")
    return proto


def main() -> None:
    """Run the rounds and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as certify/device.py sets it for a run on the CPU
    images, _ = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    x = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255
    path = demo_model_path("standard")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    copy = TorchCopy(pinned_graph(onnx.load(str(path))), Preprocessing(), 3, "NCHW", 43)
    rounds = [workload(x, sess, copy) for _ in range(args.rounds)]
    print(json.dumps({"best_s": round(min(rounds), 3), "rounds_s": [round(r, 3) for r in rounds],
                      "ort_images": ORT_PASSES * len(x), "gradient_steps_of_64": GRAD_STEPS}))


if __name__ == "__main__":
    main()
