# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %% [markdown]
# # Scale: planning time, command time and memory against GPUs
#
# Reads the JSON written by `tenplan-bench suite --suite scale --json FILE` (one
# file, or several whose rows are pooled: e.g. all planners at 1k and 4k GPUs
# and `lp` alone at 16k) and draws three panels: the slowest planning time
# and the slowest whole `tenplan plan --json` command per planner against the
# GPU count (log-log: the growth curve), the largest peak memory likewise, and
# the worst simulated makespan / certified bound per planner and GPU count;
# one row of panels per cluster fabric (`dgx-h100`, a non-blocking network,
# and `dgx-h100-rail-2to1`, a rail-optimized fabric with its spine at 2:1;
# rows without a `fabric` field are `dgx-h100`). Runs that timed out or
# failed are left out of the curves and counted in the title. Opens as a notebook (jupytext percent format) and runs headless:
#
#     python3 notebooks/scale.py notebooks/scale.json notebooks/scale.png

# %%
import json
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

args = sys.argv[1:] or ["notebooks/scale.json"]
dst = args.pop() if len(args) > 1 and args[-1].endswith(".png") else "notebooks/scale.png"
rows = []
for src in args:
    with open(src) as f:
        rows += json.load(f)
if not rows:
    sys.exit(f"{', '.join(args)}: no benchmark rows")
for key in ("gpus", "scenario", "planner", "status", "command_s"):
    missing = [i for i, r in enumerate(rows) if key not in r]
    if missing:
        sys.exit(f"row {missing[0]} has no `{key}` (not the scale suite's JSON?)")

# %%
for r in rows:
    r.setdefault("fabric", "dgx-h100")
done = [r for r in rows if r["status"] == "done"]
unfinished = len(rows) - len(done)
planners = list(dict.fromkeys(r["planner"] for r in rows))
fabrics = list(dict.fromkeys(r["fabric"] for r in rows))


def nested():
    return defaultdict(lambda: defaultdict(float))


curves = {f: {name: nested() for name in ("planning", "command", "memory", "ratio")} for f in fabrics}
for r in done:
    g, p, rep = r["gpus"], r["planner"], r["report"]
    values = {
        "planning": rep["planning_time_s"],
        "command": r["command_s"],
        "memory": rep.get("peak_memory_bytes", math.nan) / 2**30,
        "ratio": rep["makespan_s"] / rep["lower_bound_s"],
    }
    for name, v in values.items():
        curves[r["fabric"]][name][p][g] = max(curves[r["fabric"]][name][p][g], v)

fig, axes = plt.subplots(len(fabrics), 3, figsize=(17, 5.5 * len(fabrics)), squeeze=False)
for row, fabric in enumerate(fabrics):
    ax1, ax2, ax3 = axes[row]
    c = curves[fabric]
    for i, p in enumerate(planners):
        color = f"C{i}"
        for name, style in (("planning", "--"), ("command", "-")):
            pts = sorted(c[name][p].items())
            if pts:
                ax1.plot(*zip(*pts), style, marker="o", color=color, label=f"{p} ({name})")
        pts = sorted(c["memory"][p].items())
        if pts:
            ax2.plot(*zip(*pts), "-", marker="o", color=color, label=p)
        pts = sorted(c["ratio"][p].items())
        if pts:
            ax3.plot(*zip(*pts), "-", marker="o", color=color, label=p)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", linewidth=0.3)
    ax1.set_ylabel("seconds (slowest scenario)")
    ax1.set_title(f"{fabric}: planning (dashed) and whole command (solid)")
    ax1.legend(fontsize=6, ncol=2)
    ax2.set_ylabel("peak resident memory, GiB (largest scenario)")
    ax2.set_title(f"{fabric}: memory")
    ax2.legend(fontsize=7)
    ax3.axhline(1.0, color="black", linewidth=0.8)
    ax3.set_ylabel("simulated makespan / certified bound (worst scenario)")
    ax3.set_title(f"{fabric}: plan quality (1.0 = provably optimal)")
    ax3.legend(fontsize=7)
machine = rows[0].get("machine", "unknown machine")
fig.suptitle(f"tenplan scale suite: {len(done)} runs, {unfinished} timed out or failed; {machine}", fontsize=10)
fig.tight_layout()
fig.savefig(dst, dpi=120)
print(f"wrote {dst}")
