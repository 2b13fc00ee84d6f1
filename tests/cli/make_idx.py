#!/usr/bin/env python3
"""Writes small IDX datasets for the tests (nothing but the standard library).

make_idx.py DIR N_TRAIN N_TEST H W [CLASSES] [--gzip] [--channels C]
  DIR/train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-* likewise (idx4-ubyte with
  --channels). A learnable task: class k's images are bright in block k of a row of CLASSES
  vertical stripes, plus noise; labels drawn at random with a fixed seed.
"""
import argparse
import gzip
import os
import random
import struct

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("n_train", type=int)
ap.add_argument("n_test", type=int)
ap.add_argument("H", type=int)
ap.add_argument("W", type=int)
ap.add_argument("classes", type=int, nargs="?", default=10)
ap.add_argument("--gzip", action="store_true")
ap.add_argument("--channels", type=int, default=0)
a = ap.parse_args()
d, n_train, n_test, H, W, classes, C, zipped = a.dir, a.n_train, a.n_test, a.H, a.W, a.classes, a.channels, a.gzip
os.makedirs(d, exist_ok=True)
rng = random.Random(12345)


def write(path, header, payload):
    data = header + payload
    if zipped:
        with gzip.open(path + ".gz", "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


for split, n in (("train", n_train), ("t10k", n_test)):
    labels = [rng.randrange(classes) for _ in range(n)]
    pixels = bytearray()
    planes = C or 1
    for lab in labels:
        for _ in range(planes):
            for y in range(H):
                for x in range(W):
                    on = (x * classes // W) == lab
                    pixels.append(min(255, (200 if on else 20) + rng.randrange(40)))
    if C:
        write(f"{d}/{split}-images-idx4-ubyte", struct.pack(">BBBBIIII", 0, 0, 8, 4, n, C, H, W), bytes(pixels))
    else:
        write(f"{d}/{split}-images-idx3-ubyte", struct.pack(">BBBBIII", 0, 0, 8, 3, n, H, W), bytes(pixels))
    write(f"{d}/{split}-labels-idx1-ubyte", struct.pack(">BBBBI", 0, 0, 8, 1, n), bytes(labels))
