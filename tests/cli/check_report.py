#!/usr/bin/env python3
"""check_report.py HTML RUN.jsonl... : the report's SVG plots against the metrics they were drawn from.

Each run's polyline in the loss, lr, throughput and loss-against-tokens charts must have one point
per metrics line, in order (x strictly increasing), and every point mapped back through the plot's
data-* mapping (Note [Chart geometry] in zerone/report/svg_chart.h) must give the JSONL value.
Validation loss: one point per line with "val_loss". Memory: the top layer is the sum of the
categories. fp16 runs: a loss-scale chart with a dot per skipped step. The page must be
self-contained: no external URL, no <script src>, no <link>, no <img>.
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

html_path, runs = sys.argv[1], sys.argv[2:]
html = open(html_path, encoding="utf-8").read()
SVG = "{http://www.w3.org/2000/svg}"
failures = []


def fail(msg):
    failures.append(msg)


for bad in (r"<script[^>]+src=", r"<link\b", r"<img\b", r"url\(", r"@import"):
    if re.search(bad, html, re.I):
        fail(f"page is not self-contained: matches {bad}")
for url in re.findall(r"https?://[^\s\"'<>]+", html):
    if url != "http://www.w3.org/2000/svg":
        fail(f"page names an external URL {url}")

charts = {}
for block in re.findall(r"<svg\b.*?</svg>", html, re.S):
    svg = ET.fromstring(block)
    charts[svg.get("id")] = svg


def unmap(plot, x_px, y_px):
    g = lambda k: float(plot.get("data-" + k))
    x = g("x-min") + (x_px - g("left")) / (g("right") - g("left")) * (g("x-max") - g("x-min"))
    y = g("y-min") + (g("bottom") - y_px) / (g("bottom") - g("top")) * (g("y-max") - g("y-min"))
    if plot.get("data-log-y") == "1":
        y = 10 ** y
    # Half a hundredth of a pixel, as a fraction of the domain: the printing's resolution.
    x_tol = 0.006 / (g("right") - g("left")) * (g("x-max") - g("x-min"))
    y_tol = 0.006 / (g("bottom") - g("top")) * (g("y-max") - g("y-min"))
    return x, y, x_tol, y_tol


def check_series(chart_id, run, metric, xs, ys, kind="series"):
    svg = charts.get(chart_id)
    if svg is None:
        return fail(f"no chart '{chart_id}'")
    plot = svg.find(f"{SVG}g[@class='plot']")
    lines = [p for p in plot.findall(f"{SVG}polyline") if p.get("data-run") == run and p.get("data-metric") == metric
             and p.get("class") == kind]
    if len(lines) != 1:
        return fail(f"{chart_id}: {len(lines)} polylines for {run} {metric}, expected 1")
    points = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    if len(points) != len(ys):
        return fail(f"{chart_id}: {run} {metric} has {len(points)} points, the JSONL {len(ys)} values")
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        fail(f"{chart_id}: {run} {metric}: x is not strictly increasing")
    log_y = plot.get("data-log-y") == "1"
    for (px, py), x, y in zip(points, xs, ys):
        gx, gy, x_tol, y_tol = unmap(plot, px, py)
        y_ok = abs(gy - y) <= y_tol * (y * 2.31 if log_y else 1) + 1e-12
        if abs(gx - x) > x_tol + 1e-9 or not y_ok:
            return fail(f"{chart_id}: {run} {metric}: point ({px},{py}) reads ({gx},{gy}), the JSONL has ({x},{y})")
    return len(points)


def pairs(lines, x_key, y_key, scale=1):
    """(xs, ys) of the lines where both are numbers (a skipped fp16 step's norm is null)."""
    got = [(l[x_key], l[y_key] * scale) for l in lines
           if isinstance(l.get(x_key), (int, float)) and isinstance(l.get(y_key), (int, float))]
    return [x for x, _ in got], [y for _, y in got]


checked = 0
for path in runs:
    name = os.path.basename(path)[:-len(".jsonl")]
    lines = [json.loads(l) for l in open(path)]
    steps = [l["step"] for l in lines]
    unit = "samples" if "samples_per_s" in lines[0] else "tokens"
    checked += check_series("loss-step", name, "loss", steps, [l["loss"] for l in lines]) or 0
    checked += check_series("loss-tokens", name, "loss", [l[unit] for l in lines], [l["loss"] for l in lines]) or 0
    checked += check_series("lr", name, "lr", steps, [l["lr"] for l in lines]) or 0
    checked += check_series("grad-norm", name, "grad_norm", *pairs(lines, "step", "grad_norm")) or 0
    rate = unit + "_per_s"
    checked += check_series("throughput", name, rate, steps, [l[rate] for l in lines]) or 0
    if "mfu" in lines[0]:
        checked += check_series("mfu", name, "mfu", steps, [100 * l["mfu"] for l in lines]) or 0
    val = [l for l in lines if "val_loss" in l]
    if val:
        checked += check_series("loss-step", name, "val_loss", [l["step"] for l in val], [l["val_loss"] for l in val]) or 0
    if "loss_scale" in lines[0]:
        checked += check_series("loss-scale", name, "loss_scale", steps, [l["loss_scale"] for l in lines]) or 0
        skipped = [l for l in lines if l.get("skipped")]
        if skipped:
            checked += check_series("loss-scale", name, "skipped", [l["step"] for l in skipped],
                                    [l["loss_scale"] for l in skipped]) or 0
    # Memory: the top layer is the total of the categories, in MiB.
    mem_chart = next((c for c in charts.values() if c.get("id", "").startswith("memory-") and
                      any(p.get("data-run") == name for p in c.iter(f"{SVG}polyline"))), None)
    if mem_chart is None:
        fail(f"no memory chart for {name}")
    else:
        layers = [p for p in mem_chart.iter(f"{SVG}polyline") if p.get("class") == "layer"]
        total = [sum(v for k, v in l["mem"].items() if k != "peak_rss") / 2**20 for l in lines]
        checked += check_series(mem_chart.get("id"), name, layers[-1].get("data-metric"), steps, total, "layer") or 0

if failures:
    print("\n".join("FAIL " + f for f in failures))
    sys.exit(1)
print(f"ok   {html_path}: {checked} points in {len(charts)} charts read back to their JSONL values")
