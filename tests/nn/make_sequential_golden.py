#!/usr/bin/env python3
"""Writes tests/data/sequential_golden.bin: a PyTorch reference for zerone's image classifiers
(nn/sequential.h) trained with torch.optim.SGD.

Run with Debian's python3-torch (`/usr/bin/python3 tests/nn/make_sequential_golden.py`). CI does not
run this; the output file is committed. The models are built here from torch.nn layers (Conv2d,
MaxPool2d, ReLU, Flatten, Linear; nothing imported from zerone), in double precision, with
cross-entropy loss (mean over the batch), and trained for a few steps with torch.optim.SGD.

Cases: the mnist-cnn preset (SGD momentum 0.5, as the seed example), a small net with
rectangular kernels, strides and padding trained with Nesterov momentum and weight decay, and an
MLP (the shape of mnist-mlp, smaller, to keep the file small) with dampening and weight decay.

File layout (little endian):
  char[8] "ZSEQGLD1", int32 cases
  per case:
    int32 spec length, spec bytes (a zerone --model spec)
    int32 B, steps, nesterov; float32 lr, momentum, dampening, weight_decay
    int32 numel; float32 params (numel): each parameter layer's weight then bias, layer order
    float32 inputs (B x sample), int32 labels (B)
    float32 logits (B x classes) and loss of the first forward
    float32 grads (numel) of the first backward
    float32 losses of `steps` SGD steps (loss before each step), then float32 params after them
"""
import struct
import sys

import torch
import torch.nn as nn

torch.manual_seed(20261122)
torch.set_default_dtype(torch.float64)


def build(layers, in_shape):
    mods, shape = [], list(in_shape)
    for kind, a in layers:
        if kind == "conv":
            oc, (kh, kw), (sh, sw), (ph, pw) = a
            mods.append(nn.Conv2d(shape[0], oc, (kh, kw), (sh, sw), (ph, pw)))
            shape = [oc, (shape[1] + 2 * ph - kh) // sh + 1, (shape[2] + 2 * pw - kw) // sw + 1]
        elif kind == "pool":
            (kh, kw), (sh, sw), (ph, pw) = a
            mods.append(nn.MaxPool2d((kh, kw), (sh, sw), (ph, pw)))
            shape = [shape[0], (shape[1] + 2 * ph - kh) // sh + 1, (shape[2] + 2 * pw - kw) // sw + 1]
        elif kind == "relu":
            mods.append(nn.ReLU())
        elif kind == "flatten":
            mods.append(nn.Flatten())
            shape = [shape[0] * shape[1] * shape[2]] if len(shape) == 3 else shape
        elif kind == "linear":
            mods.append(nn.Linear(shape[0], a))
            shape = [a]
    return nn.Sequential(*mods)


def params_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def grads_of(model):
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def f32(t):
    return struct.pack("<%df" % t.numel(), *t.reshape(-1).float().tolist())


CASES = [
    ("mnist-cnn", [1, 28, 28],
     [("conv", (10, (5, 5), (1, 1), (0, 0))), ("pool", ((2, 2), (2, 2), (0, 0))), ("relu", None),
      ("conv", (20, (5, 5), (1, 1), (0, 0))), ("pool", ((2, 2), (2, 2), (0, 0))), ("relu", None),
      ("flatten", None), ("linear", 50), ("relu", None), ("linear", 10)],
     dict(B=4, steps=3, lr=0.05, momentum=0.5, dampening=0.0, weight_decay=0.0, nesterov=False)),
    ("seq:in=2x9x8,conv=4:k3x2:s2x1:p1x0,relu,maxpool=3x2:s2x1:p1x0,conv=3:k1,flatten,linear=7,relu,linear=5",
     [2, 9, 8],
     [("conv", (4, (3, 2), (2, 1), (1, 0))), ("relu", None), ("pool", ((3, 2), (2, 1), (1, 0))),
      ("conv", (3, (1, 1), (1, 1), (0, 0))), ("flatten", None), ("linear", 7), ("relu", None), ("linear", 5)],
     dict(B=3, steps=4, lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)),
    ("seq:in=12,linear=6,relu,linear=4", [12],
     [("linear", 6), ("relu", None), ("linear", 4)],
     dict(B=6, steps=4, lr=0.2, momentum=0.8, dampening=0.3, weight_decay=0.05, nesterov=False)),
]

out = [b"ZSEQGLD1", struct.pack("<i", len(CASES))]
for spec, in_shape, layers, o in CASES:
    model = build(layers, in_shape)
    classes = layers[-1][1]
    B = o["B"]
    x = torch.rand([B] + in_shape)  # pixels in [0, 1)
    y = torch.randint(0, classes, (B,))
    out.append(struct.pack("<i", len(spec)) + spec.encode())
    out.append(struct.pack("<iii", B, o["steps"], int(o["nesterov"])))
    out.append(struct.pack("<ffff", o["lr"], o["momentum"], o["dampening"], o["weight_decay"]))
    # Parameters rounded to f32 first, so both sides start from the same values.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.float().double())
    x = x.float().double()
    p0 = params_of(model)
    out.append(struct.pack("<i", p0.numel()) + f32(p0))
    out.append(f32(x) + struct.pack("<%di" % B, *y.tolist()))
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    out.append(f32(logits) + struct.pack("<f", loss.item()) + f32(grads_of(model)))
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], dampening=o["dampening"],
                          weight_decay=o["weight_decay"], nesterov=o["nesterov"])
    losses = []
    for _ in range(o["steps"]):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    out.append(struct.pack("<%df" % len(losses), *losses) + f32(params_of(model)))

path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/sequential_golden.bin"
with open(path, "wb") as f:
    f.write(b"".join(out))
print("wrote", path)
