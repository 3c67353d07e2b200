"""Train a small MLP on scikit-learn's digits (1,797 real 8x8 handwritten digits) on the CPU
and log its curves with tensorboardX, as a training script would: train/loss every step,
eval/loss and eval/accuracy every 20 steps, the learning rate. Numpy only (the PyTorch wheel
index was unreachable from this machine); the MLP is 64-64-10, ReLU, softmax cross-entropy,
plain minibatch SGD (batch 32) with a cosine schedule. Healthy: this run learns.

    /tmp/curves-np/bin/python tests/data/curves/make_mlp_events.py tests/data/curves/mlp_digits

(a venv with numpy, scikit-learn and tensorboardX). Deterministic from its seed, apart from
the event file's wall times and name.
"""

import math
import sys

import numpy as np
from sklearn.datasets import load_digits
from tensorboardX import SummaryWriter

STEPS, BATCH, LR, EVAL_EVERY = 600, 32, 0.1, 20


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    digits = load_digits()
    x = digits.data.astype(np.float64) / 16.0
    y = digits.target
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    xt, yt, xv, yv = x[:1400], y[:1400], x[1400:], y[1400:]
    w1 = rng.normal(0, math.sqrt(2 / 64), (64, 64))
    b1 = np.zeros(64)
    w2 = rng.normal(0, math.sqrt(2 / 64), (64, 10))
    b2 = np.zeros(10)

    def forward(xb):
        h = np.maximum(0, xb @ w1 + b1)
        z = h @ w2 + b2
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return h, p / p.sum(axis=1, keepdims=True)

    writer = SummaryWriter(out, flush_secs=1)
    for step in range(1, STEPS + 1):
        lr = LR * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        idx = rng.integers(0, len(xt), BATCH)
        xb, yb = xt[idx], yt[idx]
        h, p = forward(xb)
        loss = -np.log(p[np.arange(BATCH), yb] + 1e-12).mean()
        g = p.copy()
        g[np.arange(BATCH), yb] -= 1
        g /= BATCH
        gw2, gb2 = h.T @ g, g.sum(0)
        gh = g @ w2.T
        gh[h <= 0] = 0
        gw1, gb1 = xb.T @ gh, gh.sum(0)
        w1 -= lr * gw1
        b1 -= lr * gb1
        w2 -= lr * gw2
        b2 -= lr * gb2
        writer.add_scalar("train/loss", float(loss), step)
        writer.add_scalar("train/learning_rate", lr, step)
        if step % EVAL_EVERY == 0:
            _, pv = forward(xv)
            vloss = -np.log(pv[np.arange(len(yv)), yv] + 1e-12).mean()
            writer.add_scalar("eval/loss", float(vloss), step)
            writer.add_scalar("eval/accuracy", float((pv.argmax(1) == yv).mean()), step)
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
