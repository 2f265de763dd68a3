"""The peer's side of benchmarks/attacks.py: one run of ART's SquareAttack or HopSkipJump.

Runs in the benchmark's own environment (ART, onnxruntime, numpy). ART reaches the ONNX model
only through its black-box neural-network wrapper around a counting predict function that
returns the model's logits, as certify reads them (softmax probabilities saturate in float32
on confident images, which starves ART's margin loss).

``attacks_peer.py MODEL NPZ ATTACK SEED``: ATTACK is ``square:P_INIT:EPS`` (L∞, 1,000
iterations) or ``hopskipjump`` (L2, ε = 0.5, 20 iterations of up to 1,000 evaluations) on all
images of the npz; numpy's global stream is seeded with SEED (ART draws from it; its HSJ
start is unseeded). Prints JSON: images broken within ε, model evaluations and wall time.
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
    """Attack the images in the npz with ART once."""
    model_path, data_path, attack, seed = sys.argv[1], sys.argv[2], sys.argv[3], \
        int(sys.argv[4])
    d = np.load(data_path)
    x, y = d["x"].astype(np.float32), d["y"]
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    evals = [0]

    def predict(batch: np.ndarray) -> np.ndarray:
        evals[0] += len(batch)
        return sess.run(None, {"input": np.ascontiguousarray(batch, dtype=np.float32)})[0]

    clf = BlackBoxClassifierNeuralNetwork(predict, input_shape=x.shape[1:], nb_classes=43,
                                          clip_values=(0.0, 1.0))
    if attack.startswith("square:"):
        _, p_init, e = attack.split(":")
        eps = float(e)
        art = SquareAttack(clf, norm=np.inf, eps=eps, max_iter=1000,
                           p_init=float(p_init), nb_restarts=1,
                           batch_size=len(x), verbose=False)
    else:
        eps = 0.5
        art = HopSkipJump(clf, norm=2, max_iter=20, max_eval=1000, init_eval=100,
                          init_size=100, batch_size=64, verbose=False)
    np.random.seed(seed)
    evals[0] = 0
    t0 = time.perf_counter()
    adv = art.generate(x, y=y)
    wall = time.perf_counter() - t0
    n_eval = evals[0]
    diff = (adv - x).reshape(len(x), -1)
    size = np.abs(diff).max(axis=1) if attack.startswith("square:") else \
        np.linalg.norm(diff, axis=1)
    broken = (predict(adv).argmax(1) != y) & (size <= eps + 1e-6)
    print(json.dumps({"broken": int(broken.sum()), "evaluations": n_eval, "wall_s": wall}))


if __name__ == "__main__":
    main()
