"""What one rank spends turning a group's descriptions of its state into the
group's layout, as the group grows: the step before planning in
`tenplan.torch.reshard` and `tenplan.megatron.reshard`, which every rank of
a job runs over every rank's boxes.

The group is an FSDP2 job (every tensor of the training state sharded on its
first dimension over N ranks as `torch.chunk` splits it) of a catalog model,
moving to N/2 ranks. Each rank gives one description (`tenplan.torch.describe`'s
dicts) of its source and one of its target. One rank is measured: what
`all_gather_object` hands it (every rank's object, pickled by its owner and
unpickled here, as torch does), and its work after that, for two ways of
gathering:

- dicts: every rank's description as dicts, built by `Layout.from_descriptions`
  (how tenplan gathered before; then in Python, see --python-dicts);
- compact: each rank's boxes as integers and its names, types and shapes once
  per distinct header (`tenplan.torch._gathered`, what tenplan does now),
  built by `Layout.from_gathered`.

Beside them, the same rank's planning of the move (`lp`), the step after.
Writes a table, and JSON with --json.
"""

import argparse
import gc
import json
import os
import pickle
import platform
import resource
import time

import tenplan
import tenplan.torch as tt


def chunk(n, parts, r):
    # torch.chunk's rule: chunks of ceil(n / parts), the last ones shorter or empty.
    size = -(-n // parts)
    lo = min(n, r * size)
    return lo, min(n, lo + size)


def description(tensors, world, rank):
    return [
        {"name": t["name"], "dtype": t["dtype"], "shape": t["shape"], "box": [chunk(t["shape"][0], world, rank)] + [(0, n) for n in t["shape"][1:]]}
        for t in tensors
    ]


class FakeGroup:
    """torch.distributed's calls that `_gathered` makes, for one rank of a
    group whose other ranks' objects were pickled beforehand."""

    def __init__(self, world, objects_of):
        self.world, self.objects_of, self.received, self.unpickle_s = world, objects_of, 0, 0.0

    def all_gather_object(self, out, obj, group=None):
        blobs = [pickle.dumps(obj)] + [pickle.dumps(o) for o in self.objects_of(1, len(out))]
        # torch pads every rank's object to the largest before gathering.
        self.received += len(blobs) * max(map(len, blobs))
        t = time.perf_counter()
        out[:] = [pickle.loads(b) for b in blobs]
        self.unpickle_s += time.perf_counter() - t

    def broadcast_object_list(self, holder, group=None, group_src=None):
        blob = pickle.dumps(next(self.broadcasts))
        self.received += len(blob)
        t = time.perf_counter()
        holder[0] = pickle.loads(blob)
        self.unpickle_s += time.perf_counter() - t

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return 0


def measure(tensors, world, plan):
    order = [t["name"] for t in tensors]
    src = [description(tensors, world, r) for r in range(world)]
    dst = [description(tensors, world // 2, r) if r < world // 2 else [] for r in range(world)]
    row = {"ranks": world, "tensors": len(tensors), "boxes": sum(map(len, src)) + sum(map(len, dst))}
    # A rank holds its own description, not the group's: the collector
    # must not walk the millions of dicts this process made up for the others.
    gc.collect()
    gc.freeze()

    # dicts: the descriptions themselves.
    g = FakeGroup(world, lambda a, b: [(src[r], dst[r]) for r in range(a, b)])
    out = [None] * world
    t = time.perf_counter()
    g.all_gather_object(out, (src[0], dst[0]))
    layouts = [tenplan.Layout.from_descriptions([o[i] for o in out], None, order) for i in (0, 1)]
    row["dicts"] = {"received_bytes": g.received, "unpickle_s": g.unpickle_s, "total_s": time.perf_counter() - t}

    # compact: what tenplan.torch gathers. The other ranks' objects are what
    # they would pass (their own keys and bounds), made beforehand.
    parts = [tt._compact([src[r], dst[r]]) for r in range(world)]
    first = {}
    for r, (_, keys, _) in enumerate(parts):
        for i, k in enumerate(keys):
            first.setdefault(k, (r, i))
    # The two collectives of `_gathered`: every rank's keys and boxes, then
    # the headers of the ranks that hold them first (None from the others).
    # The collectives of `_gathered`: every rank's keys and boxes, then the
    # headers from the ranks that hold them first (broadcast one by one, or
    # gathered with None from the others when there are many).
    calls = iter(
        [
            [(keys, bounds) for _, keys, bounds in parts],
            [[h if first[k] == (r, i) else None for i, (h, k) in enumerate(zip(headers, keys))] for r, (headers, keys, _) in enumerate(parts)],
        ]
    )
    g = FakeGroup(world, lambda a, b: next(calls)[a:b])
    g.broadcasts = iter(parts[r][0][i] for r, i in first.values())
    real, tt.dist = tt.dist, g
    try:
        t = time.perf_counter()
        (sh, sr), (dh, dr) = tt._gathered([src[0], dst[0]], None)
        compact = [tenplan.Layout.from_gathered(sh, sr, None, order), tenplan.Layout.from_gathered(dh, dr, None, order)]
        row["compact"] = {"received_bytes": g.received, "unpickle_s": g.unpickle_s, "total_s": time.perf_counter() - t, "headers": len(sh) + len(dh)}
    finally:
        tt.dist = real
    assert compact == layouts, "the two ways give other layouts"
    if plan:
        t = time.perf_counter()
        p = tenplan.plan(tenplan.Problem(layouts[0], layouts[1], tenplan.default_cluster(world)), "lp")
        row["plan_s"], row["copies"] = time.perf_counter() - t, len(p)
    del src, dst, out, parts, calls, layouts, compact
    gc.unfreeze()
    gc.collect()
    row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--ranks", default="64,256,1024,4096")
    ap.add_argument("--no-plan", action="store_true", help="skip planning the move")
    ap.add_argument("--json")
    a = ap.parse_args()
    tensors = tenplan.Model(a.model).layout("dp=1", "training").tensors()
    rows = [measure(tensors, int(n), not a.no_plan) for n in a.ranks.split(",")]
    print(f"{a.model} training state ({len(tensors)} tensors), FSDP2 on N ranks -> N/2; one rank's work (seconds), gathered bytes per rank")
    print("| ranks | dicts: received | unpickle | layouts | compact: received | unpickle | layouts | compact vs dicts | plan (lp) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        d, c = r["dicts"], r["compact"]
        plan = f"{r['plan_s']:.2f}" if "plan_s" in r else "-"
        print(
            f"| {r['ranks']} | {d['received_bytes'] / 1e6:.1f} MB | {d['unpickle_s']:.2f} | {d['total_s'] - d['unpickle_s']:.2f} "
            f"| {c['received_bytes'] / 1e6:.1f} MB | {c['unpickle_s']:.2f} | {c['total_s'] - c['unpickle_s']:.2f} | {d['total_s'] / c['total_s']:.1f}x faster | {plan} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
            json.dump({"machine": machine, "model": a.model, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
