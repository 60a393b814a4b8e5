# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     name: python3
# ---

# %% [markdown]
# # Hot switching: per-step switching time of `lp` and the HotSPa baseline
#
# Reads the JSON written by `tenplan-bench switch --json FILE` (the `hotspa`
# suite: LLaMA-2 7B and 13B on one and two DGX-H100 nodes, strategies
# TP ∈ {1, 2, 4, 8} with DP = GPUs / TP, moving the weights alone or the
# weights and accumulated gradients) and draws, per case, the switching time
# of one training step under each planner (best order of the strategies for
# each), with the sum of the switches' lower bounds as a marker. Runs
# headless:
#
#     python3 notebooks/hotspa.py notebooks/hotspa.json notebooks/hotspa.png

# %%
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "notebooks/hotspa.json"
dst = sys.argv[2] if len(sys.argv) > 2 else "notebooks/hotspa.png"
with open(src) as f:
    rows = json.load(f)
if not rows:
    sys.exit(f"{src}: no benchmark rows")
for key in ("model", "gpus", "state", "planner", "total_s", "total_bound_s"):
    missing = [i for i, r in enumerate(rows) if key not in r]
    if missing:
        sys.exit(f"{src}: row {missing[0]} has no `{key}`")

# %%
cases = list(dict.fromkeys((r["model"], r["gpus"], r["state"]) for r in rows))
planners = list(dict.fromkeys(r["planner"] for r in rows))
total = {(r["model"], r["gpus"], r["state"], r["planner"]): r["total_s"] for r in rows}
bound = {(r["model"], r["gpus"], r["state"]): r["total_bound_s"] for r in rows}

fig, ax = plt.subplots(figsize=(11, 5))
width = 0.8 / len(planners)
for i, p in enumerate(planners):
    xs = [j + i * width for j in range(len(cases))]
    ax.bar(xs, [1e3 * total.get(c + (p,), math.nan) for c in cases], width, label=p)
centers = [j + 0.4 - width / 2 for j in range(len(cases))]
ax.scatter(centers, [1e3 * bound[c] for c in cases], marker="_", s=600, color="black", zorder=3,
           label="lower bound (sum over switches)")
ax.set_xticks(centers)
ax.set_xticklabels([f"{m}\n{g} GPUs\n{s}" for m, g, s in cases], fontsize=7)
ax.set_ylabel("switching time per training step (ms)")
ax.set_title("Hot switching between TP ∈ {1,2,4,8}: lp vs the HotSPa baseline")
ax.legend()
fig.tight_layout()
fig.savefig(dst, dpi=120)
print(f"wrote {dst}")
