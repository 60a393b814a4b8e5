"""The scheduler's question from Python: what does moving job J from layout
A on devices X to layout B on devices Y cost? Calls per second of
tenplan.cost on GPT-3 6.7B (training state) on 16 GPUs (two DGX-H100
nodes), every question new (uncached), with the layouts of every
configuration built once beforehand (a scheduler asks about the same
configurations again and again; `tenplan.cost` keeps them):

- bound only (`bound_only=True`): the certified lower bound, no plan;
- `lp`: the optimal plan, checked by the independent checker, simulated,
  with its certified bound;
- the baselines (`tenplex`, `hotspa`, `least-loaded`) on the first
  questions, for comparison;

then the same questions asked again (cached), a Python dict lookup as the
floor of any cached answer, and how far the bound-only answer lies below
`lp`'s simulated makespan: what a scheduler trades for asking only the
bound. Writes a table and, with --json, the rows and the machine.

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
# Configurations of an 8- or 16-GPU job on the two nodes.
CONFIGS = [
    "tp=8",
    "tp=8,devices=8-15",
    "tp=4,dp=2",
    "tp=4,dp=2,devices=8-15",
    "tp=4,dp=4",
    "tp=8,dp=2",
    "tp=2,pp=2,dp=2",
    "tp=2,pp=2,dp=4",
    "tp=4,pp=2,dp=2",
    "tp=4,pp=2",
    "tp=2,pp=4",
    "tp=8,pp=2",
    "tp=2,pp=4,dp=2",
    "tp=1,pp=8",
    "tp=2,dp=4",
    "tp=1,pp=8,dp=2",
]


def ring(configs):
    return [(a, configs[(i + 1) % len(configs)]) for i, a in enumerate(configs)]


def questions(configs):
    """Every ordered pair of distinct configurations except the ring that
    warms the layouts: each asked once, uncached."""
    warm = set(ring(configs))
    return [(a, b) for a in configs for b in configs if a != b and (a, b) not in warm]


def timed(ask, qs):
    times, answers = [], []
    for src, dst in qs:
        t = time.perf_counter()
        answers.append(ask(src, dst))
        times.append(time.perf_counter() - t)
    return times, answers


def row(name, times, answers, cached):
    r = {
        "answer": name,
        "questions": len(times),
        "uncached_median_ms": statistics.median(times) * 1e3,
        "uncached_max_ms": max(times) * 1e3,
        "uncached_calls_per_s": len(times) / sum(times),
        "cached_calls_per_s": cached,
    }
    if "timings" in answers[0]:
        for k in ["verify_s", "bound_s", "loads_s", "simulate_s"]:
            r["mean_" + k[:-2] + "_ms"] = statistics.mean(a["timings"][k] for a in answers) * 1e3
        r["mean_planning_ms"] = statistics.mean(a["planning_time_s"] for a in answers) * 1e3
        r["mean_copies"] = statistics.mean(a["copies"] for a in answers)
    return r


def cached_rate(ask, qs, seconds):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        src, dst = qs[n % len(qs)]
        ask(src, dst)
        n += 1
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--lp-questions", type=int, default=96, help="questions asked of lp (of 224)")
    ap.add_argument("--baseline-questions", type=int, default=16)
    ap.add_argument("--cached-seconds", type=float, default=1.0)
    a = ap.parse_args()
    m, c = tenplan.Model(MODEL), tenplan.Cluster(CLUSTER)

    t = time.perf_counter()
    for src, dst in ring(CONFIGS):
        tenplan.cost(m, src, dst, c, bound_only=True)
    warm_s = time.perf_counter() - t
    qs = questions(CONFIGS)

    rows = []

    def bound(src, dst):
        return tenplan.cost(m, src, dst, c, bound_only=True)

    times, bounds = timed(bound, qs)
    rows.append(row("bound only", times, bounds, cached_rate(bound, qs, a.cached_seconds)))
    by_question = dict(zip(qs, bounds))

    gaps = {}
    for planner, n in [("lp", a.lp_questions)] + [(p, a.baseline_questions) for p in ["tenplex", "hotspa", "least-loaded"]]:
        sub = qs[:n]

        def plan(src, dst, planner=planner):
            return tenplan.cost(m, src, dst, c, planner=planner)

        times, answers = timed(plan, sub)
        rows.append(row(planner, times, answers, cached_rate(plan, sub, a.cached_seconds)))
        if planner == "lp":
            ratios = [
                x["makespan_s"] / by_question[q]["lower_bound_s"] for q, x in zip(sub, answers) if by_question[q]["lower_bound_s"] > 0
            ]
            own = [x["makespan_s"] / x["lower_bound_s"] for x in answers if x["lower_bound_s"] > 0]
            tighter = sum(1 for q, x in zip(sub, answers) if x["lower_bound_s"] > by_question[q]["lower_bound_s"] * (1 + 1e-6))
            gaps = {
                "questions": len(ratios),
                "lp_makespan_over_bound_only_mean": statistics.mean(ratios),
                "lp_makespan_over_bound_only_median": statistics.median(ratios),
                "lp_makespan_over_bound_only_max": max(ratios),
                "lp_makespan_over_its_certified_bound_mean": statistics.mean(own),
                "lp_bound_tighter_than_bound_only": tighter,
            }

    d, n, t0 = {q: 1 for q in qs}, 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        d[qs[n % len(qs)]]
        n += 1
    floor = n / (time.perf_counter() - t0)

    print(
        f"tenplan.cost on {MODEL}, {CLUSTER} (16 GPUs), training state; {len(CONFIGS)} configurations, "
        f"layouts built once ({warm_s * 1e3:.0f} ms for all), {len(qs)} questions"
    )
    print(f"{'answer':<14}{'questions':>10}{'median':>11}{'max':>11}{'calls/s':>10}{'cached/s':>11}{'plan':>8}{'check':>8}{'bound':>8}{'sim':>7}")
    for r in rows:
        parts = "".join(f"{r[k]:>8.2f}" if k in r else f"{'':>8}" for k in ["mean_planning_ms", "mean_verify_ms", "mean_bound_ms"])
        sim = f"{r['mean_simulate_ms']:>7.2f}" if "mean_simulate_ms" in r else f"{'':>7}"
        print(
            f"{r['answer']:<14}{r['questions']:>10}{r['uncached_median_ms']:>8.2f} ms{r['uncached_max_ms']:>8.2f} ms"
            f"{r['uncached_calls_per_s']:>10.1f}{r['cached_calls_per_s']:>11.0f}{parts}{sim}"
        )
    print("(plan, check, bound, sim: mean ms per uncached call; a Python dict lookup: %.0f per second)" % floor)
    if gaps:
        print(
            f"lp's simulated makespan over the bound-only answer, {gaps['questions']} questions: "
            f"mean {gaps['lp_makespan_over_bound_only_mean']:.4f}, median {gaps['lp_makespan_over_bound_only_median']:.4f}, "
            f"max {gaps['lp_makespan_over_bound_only_max']:.4f} (over lp's own certified bound: mean "
            f"{gaps['lp_makespan_over_its_certified_bound_mean']:.4f}; lp's bound tighter on {gaps['lp_bound_tighter_than_bound_only']})"
        )
    if a.json:
        machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
        with open(a.json, "w") as f:
            json.dump(
                {
                    "machine": machine,
                    "model": MODEL,
                    "cluster": CLUSTER,
                    "configs": CONFIGS,
                    "layouts_built_s": warm_s,
                    "rows": rows,
                    "bound_only_gap": gaps,
                    "dict_lookups_per_s": floor,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
