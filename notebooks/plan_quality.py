# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %% [markdown]
# # Plan quality: tenplan's planners against the lower bound and each other
#
# Reads the JSON written by `tenplan-bench suite --suite SUITE --json FILE` and draws
# two panels: the simulated makespan of every planner divided by the certified
# lower bound, per scenario (1.0 is optimal; lower is better), and planning
# time against the number of GPUs. Opens as a notebook (jupytext percent
# format) and runs headless as a script:
#
#     python3 notebooks/plan_quality.py bench.json notebooks/plan_quality.png

# %%
import json
import math
import sys
from collections import defaultdict

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "notebooks/bench.json"
dst = sys.argv[2] if len(sys.argv) > 2 else "notebooks/plan_quality.png"
with open(src) as f:
    rows = json.load(f)
if not rows:
    sys.exit(f"{src}: no benchmark rows")
for key in ("scenario", "planner", "makespan_s", "lower_bound_s", "planning_time_s", "gpus"):
    missing = [i for i, r in enumerate(rows) if key not in r]
    if missing:
        sys.exit(f"{src}: row {missing[0]} has no `{key}`")

# %%
scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
planners = list(dict.fromkeys(r["planner"] for r in rows))
ratio = {(r["scenario"], r["planner"]): r["makespan_s"] / r["lower_bound_s"] for r in rows}

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 1]})
width = 0.8 / len(planners)
for i, p in enumerate(planners):
    xs = [j + i * width for j in range(len(scenarios))]
    ys = [ratio.get((s, p), math.nan) for s in scenarios]
    ax1.bar(xs, ys, width, label=p)
# Weight syncs (the rl suite) also carry checkpoint-engine's broadcast
# floor: the least time a bucketed broadcast to every engine device takes.
floor = {r["scenario"]: r["broadcast_floor_s"] / r["lower_bound_s"] for r in rows if r.get("broadcast_floor_s")}
if floor:
    xs = [j + 0.4 - width / 2 for j, s in enumerate(scenarios) if s in floor]
    ax1.scatter(xs, [floor[s] for s in scenarios if s in floor], marker="_", s=900, color="black", zorder=3,
                label="broadcast floor (checkpoint-engine)")
ax1.axhline(1.0, color="black", linewidth=0.8)
ax1.set_yscale("log")
ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(scenarios))])
ax1.set_xticklabels(scenarios, rotation=60, ha="right", fontsize=7)
ax1.set_ylabel("simulated makespan / lower bound (log)")
ax1.set_title("Plan quality (1.0 = provably optimal)")
ax1.legend(fontsize=8)

# %%
times = defaultdict(list)
for r in rows:
    times[r["planner"]].append((r["gpus"], r["planning_time_s"]))
for p in planners:
    pts = sorted(times[p])
    ax2.plot([g for g, _ in pts], [t for _, t in pts], "o", label=p, alpha=0.7)
ax2.set_xscale("log")
ax2.set_yscale("log")
ax2.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
ax2.set_xlabel("GPUs")
ax2.set_ylabel("planning time (s)")
ax2.set_title("Planning time")
ax2.legend(fontsize=8)

machine = rows[0].get("machine", "unknown machine")
fig.suptitle(f"tenplan-bench suite ({machine})", fontsize=9)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print(f"wrote {dst} from {len(rows)} rows")
