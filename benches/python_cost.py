"""The scheduler's question from Python: what does moving job J from layout
A on devices X to layout B on devices Y cost? Calls per second of
tenplan.cost on GPT-3 6.7B on 16 GPUs (two DGX-H100 nodes), uncached (every
question new: plan, check, bound, simulate) and cached (asked again), for
each planner; beside it, a Python dict lookup as the floor of any cached
answer. Writes a table and, with --json, the rows and the machine.

Run: make bench-python (builds the release wheel first)
"""

import argparse
import json
import os
import platform
import statistics
import time

import tenplan

MODEL, CLUSTER = "gpt3-6.7b", "dgx-h100:2"
# Questions a scheduler asks about one 8-GPU job: move it, grow it, shrink it.
QUESTIONS = [
    ("tp=8", "tp=8,devices=8-15"),
    ("tp=8", "tp=4,dp=2,devices=0-7"),
    ("tp=8", "tp=4,dp=4"),
    ("tp=8", "tp=8,dp=2"),
    ("tp=4,dp=2", "tp=8,devices=8-15"),
    ("tp=4,dp=2", "tp=2,pp=2,dp=4"),
    ("tp=2,pp=2,dp=2", "tp=4,pp=2,dp=2"),
    ("tp=2,pp=2,dp=2", "tp=8,devices=8-15"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--cached-seconds", type=float, default=2.0)
    a = ap.parse_args()
    m, c = tenplan.Model(MODEL), tenplan.Cluster(CLUSTER)
    rows = []
    for planner in ["lp", "tenplex", "hotspa", "least-loaded"]:
        times, answers = [], []
        for src, dst in QUESTIONS:
            t = time.perf_counter()
            r = tenplan.cost(m, src, dst, c, planner=planner)
            times.append(time.perf_counter() - t)
            answers.append(r)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.cached_seconds:
            src, dst = QUESTIONS[n % len(QUESTIONS)]
            tenplan.cost(m, src, dst, c, planner=planner)
            n += 1
        cached = n / (time.perf_counter() - t0)
        rows.append(
            {
                "planner": planner,
                "questions": len(QUESTIONS),
                "uncached_median_s": statistics.median(times),
                "uncached_max_s": max(times),
                "uncached_calls_per_s": len(times) / sum(times),
                "cached_calls_per_s": cached,
                "mean_gap": statistics.mean(r["gap"] for r in answers),
            }
        )
    d, n, t0 = {q: 1 for q in QUESTIONS}, 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        d[QUESTIONS[n % len(QUESTIONS)]]
        n += 1
    floor = n / (time.perf_counter() - t0)
    print(f"tenplan.cost on {MODEL}, {CLUSTER} (16 GPUs), {len(QUESTIONS)} questions, training state")
    print(f"{'planner':<14}{'uncached med':>14}{'max':>10}{'calls/s':>10}{'cached calls/s':>16}{'vs dict':>9}{'mean gap':>10}")
    for r in rows:
        print(
            f"{r['planner']:<14}{r['uncached_median_s'] * 1e3:>11.1f} ms{r['uncached_max_s'] * 1e3:>7.1f} ms"
            f"{r['uncached_calls_per_s']:>10.1f}{r['cached_calls_per_s']:>16.0f}{floor / r['cached_calls_per_s']:>8.0f}x"
            f"{r['mean_gap']:>10.4f}"
        )
    print(f"(a Python dict lookup: {floor:.0f} per second)")
    if a.json:
        machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "model": MODEL, "cluster": CLUSTER, "rows": rows, "dict_lookups_per_s": floor}, f, indent=1)


if __name__ == "__main__":
    main()
