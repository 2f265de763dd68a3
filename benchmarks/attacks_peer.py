"""The peer's side of benchmarks/attacks.py: ART's SquareAttack and HopSkipJump.

Runs in the benchmark's own environment (ART, onnxruntime, numpy). ART reaches the ONNX model
only through its black-box neural-network wrapper around a counting predict function.
Prints JSON: per attack, images broken within ε, model evaluations and wall time.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import onnxruntime as ort
from art.attacks.evasion import HopSkipJump, SquareAttack
from art.estimators.classification import BlackBoxClassifierNeuralNetwork


def main() -> None:
    """Attack the images in the npz with ART at the given budget."""
    model_path, data_path, iters, hsj_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4])
    eps = 8 / 255
    d = np.load(data_path)
    x, y = d["x"].astype(np.float32), d["y"]
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    evals = [0]

    def predict(batch: np.ndarray) -> np.ndarray:
        evals[0] += len(batch)
        out = sess.run(None, {"input": np.ascontiguousarray(batch, dtype=np.float32)})[0]
        e = np.exp(out - out.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    clf = BlackBoxClassifierNeuralNetwork(predict, input_shape=x.shape[1:], nb_classes=43,
                                          clip_values=(0.0, 1.0))
    res = {}
    attack = SquareAttack(clf, norm=np.inf, eps=eps, max_iter=iters, p_init=0.05, nb_restarts=1,
                          batch_size=len(x), verbose=False)
    evals[0] = 0
    t0 = time.perf_counter()
    adv = attack.generate(x, y=y)
    wall = time.perf_counter() - t0
    n_eval = evals[0]
    ok = np.abs(adv - x).reshape(len(x), -1).max(axis=1) <= eps + 1e-6
    broken = (predict(adv).argmax(1) != y) & ok
    res["square_linf"] = {"n": len(x), "broken": int(broken.sum()), "evaluations": n_eval,
                          "wall_s": wall}
    xs, ys = x[:hsj_n], y[:hsj_n]
    hsj = HopSkipJump(clf, norm=2, max_iter=20, max_eval=1000, init_eval=100, init_size=100,
                      batch_size=64, verbose=False)
    evals[0] = 0
    t0 = time.perf_counter()
    adv = hsj.generate(xs, y=ys)
    wall = time.perf_counter() - t0
    n_eval = evals[0]
    dist = np.linalg.norm((adv - xs).reshape(len(xs), -1), axis=1)
    broken = (predict(adv).argmax(1) != ys) & (dist <= 0.5 + 1e-6)
    res["hopskipjump_l2"] = {"n": len(xs), "broken": int(broken.sum()), "evaluations": n_eval,
                             "wall_s": wall, "median_l2": float(np.median(dist))}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
