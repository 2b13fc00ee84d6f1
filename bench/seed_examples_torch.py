#!/usr/bin/env python3
"""PyTorch peer of zerone's seed examples (issue 11, W7): the same model, data and hyperparameters
as `zerone train --model mnist-mlp|mnist-cnn --data DIR --optimizer sgd ...`, on the CPU.

  seed_examples_torch.py --model mnist-mlp|mnist-cnn --data DIR --epochs N --micro-batch B --lr X
                         --momentum M [--threads T] [--seed S] [--compile]

Data: the IDX files of DIR (gzip or raw) read once into tensors, pixels / 255 (torchvision's
ToTensor), a fresh random permutation per epoch, batches of B with the remainder dropped (as
zerone's epochs), no DataLoader workers (the whole set is in memory, as in zerone). Model: torch.nn
layers with PyTorch's default initialization; loss: cross-entropy (mean over the batch); optimizer:
torch.optim.SGD. --compile: the model through torch.compile (PyTorch 2; the first epoch then includes
the compilation, so compare its later epochs). After each epoch the whole test split is evaluated (batches of B, no_grad).

Prints one JSON line per epoch: {"epoch", "train_s" (training loop only), "eval_s", "val_loss",
"val_accuracy"}.
"""
import argparse
import gzip
import json
import struct
import time

import torch
import torch.nn as nn


def read_idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    assert zero == 0 and dtype == 8, path
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def split(d, name):
    import os
    def find(stem):
        for p in (f"{d}/{stem}", f"{d}/{stem}.gz"):
            if os.path.exists(p):
                return p
        raise FileNotFoundError(stem)
    x = read_idx(find(f"{name}-images-idx3-ubyte")).float().div(255).unsqueeze(1)  # (N, 1, H, W)
    y = read_idx(find(f"{name}-labels-idx1-ubyte")).long()
    return x, y


def model_of(name):
    if name == "mnist-mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "mnist-cnn":  # PyTorch's classic SimpleCNN, as zerone's preset (no dropout)
        return nn.Sequential(nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5), nn.MaxPool2d(2),
                             nn.ReLU(), nn.Flatten(), nn.Linear(320, 50), nn.ReLU(), nn.Linear(50, 10))
    raise ValueError(name)


ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--micro-batch", type=int, default=64)
ap.add_argument("--lr", type=float, default=0.01)
ap.add_argument("--momentum", type=float, default=0.9)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--seed", type=int, default=1337)
ap.add_argument("--compile", action="store_true")
a = ap.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)
xtr, ytr = split(a.data, "train")
xte, yte = split(a.data, "t10k")
model = model_of(a.model)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
run = torch.compile(model) if a.compile else model
loss_fn = nn.CrossEntropyLoss()
B = a.micro_batch
steps = xtr.shape[0] // B
for epoch in range(1, a.epochs + 1):
    t0 = time.perf_counter()
    model.train()
    perm = torch.randperm(xtr.shape[0])
    for s in range(steps):
        idx = perm[s * B:(s + 1) * B]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(run(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, xte.shape[0], B):
            out = run(xte[i:i + B])
            total += loss_fn(out, yte[i:i + B]).item() * out.shape[0]
            correct += (out.argmax(1) == yte[i:i + B]).sum().item()
    print(json.dumps({"epoch": epoch, "train_s": train_s, "eval_s": time.perf_counter() - t1,
                      "val_loss": total / xte.shape[0], "val_accuracy": correct / xte.shape[0]}), flush=True)
