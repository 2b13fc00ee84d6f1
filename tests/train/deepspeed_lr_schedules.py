#!/usr/bin/env python3
"""Reference values for tests/train/lr_schedule_test.cc: DeepSpeed's WarmupLR, WarmupDecayLR and
WarmupCosineLR restated in plain Python from deepspeed/runtime/lr_schedules.py, driven the way
deepspeed/runtime/engine.py drives them (the constructor writes the value at
last_batch_iteration = -1 into the optimizer; the engine calls scheduler.step() after every
optimizer step that did not overflow, never at start-up).

Prints, for each case, the learning rate each optimizer step runs at. Run it and paste the
output into the test when the cases change:  python3 tests/train/deepspeed_lr_schedules.py
"""
import math


class WarmupLR:
    def __init__(self, lr, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000, warmup_type="log"):
        self.min_lr, self.max_lr = warmup_min_lr, warmup_max_lr
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = -1
        self.lr = self.get_lr()  # the constructor initialises the optimizer's lr

    def warmup_gamma(self):
        if self.warmup_type == "log":
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps

    def gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_gamma()
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return self.min_lr
        return self.min_lr + (self.max_lr - self.min_lr) * self.gamma()

    def step(self):
        self.last_batch_iteration += 1
        self.lr = self.get_lr()


class WarmupDecayLR(WarmupLR):
    def __init__(self, lr, total_num_steps, **kw):
        self.total_num_steps = total_num_steps
        super().__init__(lr, **kw)

    def gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_gamma()
        return max(0.0, float(self.total_num_steps - self.last_batch_iteration) /
                   float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR:
    def __init__(self, lr, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000, cos_min_ratio=0.0001,
                 warmup_type="log"):
        self.org_lr = lr
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio, self.cos_min_ratio = warmup_min_ratio, cos_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = -1
        self.lr = self.get_lr()

    def ratio(self):
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            if self.warmup_type == "log":
                r = self.inverse_log_warm_up * math.log(i + 1)
            else:
                r = i / self.warmup_num_steps
            return self.warmup_min_ratio + r * (1.0 - self.warmup_min_ratio)
        real_last_step = i - self.warmup_num_steps + 1
        real_total_steps = self.total_num_steps - self.warmup_num_steps
        r = (1 + math.cos(math.pi * real_last_step / real_total_steps)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * r)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return 0.0
        return self.org_lr * self.ratio()

    def step(self):
        self.last_batch_iteration += 1
        self.lr = self.get_lr()


def run(scheduler, steps, skipped=()):
    """The lr of optimizer steps 1..steps; steps in `skipped` overflowed (no scheduler.step())."""
    lrs = []
    for s in range(1, steps + 1):
        lrs.append(scheduler.lr)
        if s not in skipped:
            scheduler.step()
    return lrs


CASES = [
    ("WarmupLR log", WarmupLR(1e-3, warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=5), 8, ()),
    ("WarmupLR linear", WarmupLR(1e-3, warmup_min_lr=0.0, warmup_max_lr=2e-3, warmup_num_steps=4,
                                 warmup_type="linear"), 7, ()),
    ("WarmupLR warmup 0 (clamped to 2)", WarmupLR(1e-3, warmup_max_lr=1e-3, warmup_num_steps=0,
                                                  warmup_type="linear"), 4, ()),
    ("WarmupDecayLR linear", WarmupDecayLR(1e-3, 10, warmup_min_lr=1e-4, warmup_max_lr=1e-3, warmup_num_steps=3,
                                           warmup_type="linear"), 13, ()),
    ("WarmupDecayLR log, steps 2 and 3 skipped", WarmupDecayLR(1e-3, 8, warmup_max_lr=5e-4, warmup_num_steps=4),
     10, (2, 3)),
    ("WarmupCosineLR log", WarmupCosineLR(3e-3, 12, warmup_min_ratio=0.1, warmup_num_steps=4, cos_min_ratio=0.01),
     14, ()),
    ("WarmupCosineLR linear", WarmupCosineLR(1e-3, 6, warmup_num_steps=2, warmup_type="linear"), 8, ()),
]

if __name__ == "__main__":
    for name, scheduler, steps, skipped in CASES:
        print(f"// {name}")
        print("{" + ", ".join(f"{x:.17g}" for x in run(scheduler, steps, skipped)) + "}")
