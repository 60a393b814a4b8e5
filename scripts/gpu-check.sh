#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, run on a machine that has one from
# what `scripts/gpu-check.sh pack` built on this one (into .gpu/: the
# executor's CUDA test binary, a CUDA build of `tenplan` and the Python
# wheel), since such machines often have CUDA, PyTorch and NCCL but no Rust:
#
#   bash scripts/gpu-check.sh pack            # here: build into .gpu/
#   bash scripts/gpu-check.sh [STEP...]       # there (default: every step)
#
# Steps: info, cuda (the CUDA back end against the host interpreter, both
# copy paths and the reduce kernel, TENPLAN_REQUIRE_CUDA=1 so a missing GPU
# fails), nccl (the torch.distributed executor on NCCL,
# python/tests/test_nccl.py), torch-gpu (benches/torch_gpu.py), executor
# (tenplan bench-executor with its GPU columns: box copies and
# reduce-copies, each against one dtod copy), two-ranks (what NCCL says to
# two ranks on one GPU). Logs and JSON go to $OUT (default
# target/gpu-check); exits non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
G=.gpu

if [ "${1:-}" = pack ]; then
  set -e
  cargo test --release -p tenplan-executor --features cuda --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "backends" and m.get("executable"):
        print(m["executable"])' > /tmp/tenplan-backends-path
  cargo build --release --features cuda --bin tenplan
  (cd python && "${TENPLAN_VENV:-$HOME/.cache/tenplan/venv}/bin/maturin" build --release --quiet --out ../target/wheels-gpu)
  rm -rf "$G" && mkdir -p "$G"
  cp "$(cat /tmp/tenplan-backends-path)" "$G/backends"
  cp target/release/tenplan "$G/tenplan"
  cp "$(ls -t target/wheels-gpu/tenplan-*.whl | head -1)" "$G/"
  strip "$G/backends" "$G/tenplan"
  x=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$x")" && { grep -qx /.gpu/ "$x" 2>/dev/null || echo /.gpu/ >> "$x"; }
  du -sh "$G"
  exit 0
fi

OUT=${OUT:-target/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export TENPLAN_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
failed=()

step() {
  local name=$1
  shift
  echo "== $name"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

python_env() {
  # The wheel built beside the binaries, over this machine's torch.
  if [ ! -d /tmp/tenplan-site ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/tenplan-site $G/tenplan-*.whl || return 1
  fi
  export PYTHONPATH=/tmp/tenplan-site TENPLAN_BIN=$PWD/$G/tenplan
}

info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  nproc
}

cuda() {
  # Three runs of the property test (fresh random problems each run).
  for i in 1 2 3; do
    $G/backends --test-threads "$(nproc)" || return 1
  done
}

nccl() {
  python_env && $PY -m pytest -q -rs python/tests/test_nccl.py
}

torch_gpu() {
  python_env && $PY benches/torch_gpu.py --reps 5 --json "$OUT/torch_gpu.json"
}

executor() {
  $G/tenplan bench-executor --reps 5 --python "$PY" --json "$OUT/executor_gpu.json"
}

two_ranks() {
  # NCCL refuses two ranks on one GPU; record what it says.
  # (spawned children re-import the script: it must be a file)
  cat > /tmp/two_ranks.py <<'EOF'
import datetime, os, torch, torch.distributed as dist, torch.multiprocessing as mp

def probe(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4, device="cuda")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(f"rank {rank}: all_reduce gave {t.tolist()}", flush=True)
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[-1]}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(probe, nprocs=2, start_method="spawn", join=True)
EOF
  $PY /tmp/two_ranks.py
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(info cuda nccl torch-gpu executor)
for s in "${steps[@]}"; do
  step "$s" "${s//-/_}"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu-check: every step passed"
