# tenplan: the two commands of the README, and their parts.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
# CI builds exactly what Cargo.lock says.
LOCKED := $(if $(CI),--locked,)

.PHONY: setup demo test lint doc unit python example bench-python bench-torch bench-count bench-gather bench-fsdp2 bench-megatron bench-rl bench-m2n interop notebook bench bench-scale bench-mesh bench-executor bench-hf fuzz fuzz-smoke cuda-ptx

setup:
	@bash scripts/setup.sh

## Install what is missing, build in release mode, run the Tenplex paper scenarios.
demo: setup
	cargo run $(LOCKED) --release --quiet -p tenplan-bench -- demo

## Everything CI checks: formatting, lints, the crates' layering, docs, the
## whole test suite, and the notebook on a fresh paper-suite benchmark.
test: setup lint doc unit python example fuzz-smoke interop notebook

lint:
	cargo fmt --all -- --check
	cargo clippy $(LOCKED) --workspace --all-targets --quiet -- -D warnings
	# The CUDA back end compiles without a CUDA toolkit (the driver loads at run time).
	cargo clippy $(LOCKED) --workspace --all-targets --quiet --features cuda -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc $(LOCKED) --workspace --no-deps --quiet

## The tests (tests/layering.rs checks that no crate reaches upward).
unit:
	cargo test $(LOCKED) --workspace --all-targets
	cargo test $(LOCKED) --workspace --doc

## The Python package: build the wheel (maturin, the dev profile and the same
## target directory as cargo), install it into the torch environment, check
## its stubs against the binding (mypy's stubtest), run its tests (the API,
## checkpoints, and the torch.distributed executor on 4 gloo processes).
VENV ?= $(or $(TENPLAN_VENV),$(HOME)/.cache/tenplan/venv)
TARGET_DIR = $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
python:
	cd python && $(VENV)/bin/maturin build $(LOCKED) --quiet --out $(TARGET_DIR)/wheels
	$(VENV)/bin/pip install --quiet --force-reinstall --no-deps $(TARGET_DIR)/wheels/tenplan-*-abi3-*.whl
	# From the target directory: python/ would shadow the installed package.
	cd $(TARGET_DIR) && $(VENV)/bin/python -m mypy.stubtest tenplan._tenplan
	cargo build $(LOCKED) --quiet --bin tenplan
	TENPLAN_BIN=$(TARGET_DIR)/debug/tenplan $(VENV)/bin/python -m pytest -q python/tests

## The live elastic-training example: 4 gloo processes change parallelism
## and lose two ranks mid-training; the loss curve must match an
## uninterrupted run's (needs the package: make python).
example:
	$(VENV)/bin/python examples/elastic_gpt.py --json $(TARGET_DIR)/elastic_gpt.json

## The scheduler's question from Python, calls per second (release wheel),
## and how far its bound-only answer lies below lp's makespan over the
## paper, large and scale suites (their recorded results).
bench-python: setup
	cd python && $(VENV)/bin/maturin build $(LOCKED) --release --quiet --out $(TARGET_DIR)/wheels-release
	$(VENV)/bin/pip install --quiet --force-reinstall --no-deps $(TARGET_DIR)/wheels-release/tenplan-*-abi3-*.whl
	$(VENV)/bin/python benches/python_cost.py --json notebooks/python_cost.json | tee notebooks/python_cost.md
	cargo run $(LOCKED) --release --quiet -p tenplan-bench -- bound-gap --json notebooks/bound_gap.json | tee notebooks/bound_gap.md

## A DTensor state dict (GPT-3 350M fp32, 1.42 GB) resharded Shard(0) ->
## Shard(1) on 4 gloo processes: the torch.distributed executor against DCP
## save + load through /dev/shm and a gloo ring of the same bytes, same run
## (needs the package: make python).
bench-torch: setup
	$(VENV)/bin/python benches/torch_reshard.py --reps 9 --json notebooks/torch_reshard.json | tee notebooks/torch_reshard.md
	$(VENV)/bin/python benches/torch_reshard.py --case sync --reps 9 --json notebooks/torch_sync.json | tee notebooks/torch_sync.md
	$(VENV)/bin/python benches/torch_reshard.py --case partial --reps 9 --json notebooks/torch_partial.json | tee notebooks/torch_partial.md

## What the number of tensors costs the torch.distributed executor: 1,000 to
## 32,000 DTensors on 4 gloo processes, layouts, planning, prepare and a call,
## beside DTensor's redistribute and gloo's all_to_all (needs the package).
bench-count: setup
	$(VENV)/bin/python benches/tensor_count.py --json notebooks/tensor_count.json | tee notebooks/tensor_count.md

## What one rank of a group of 64 to 4,096 spends building the group's
## layouts from every rank's description, before planning (needs the package).
bench-gather: setup
	$(VENV)/bin/python benches/gather_scale.py --json notebooks/gather_scale.json | tee notebooks/gather_scale.md

## An FSDP2 job's AdamW checkpoint (207M-parameter Llama, 2.5 GB) from 4 ranks
## to 2 and to a 2x2 HSDP mesh: tenplan reshard + plain dcp.load against DCP's
## own load-time reshard, and against `cp -r` of the checkpoint.
bench-fsdp2: setup
	cargo build $(LOCKED) --release --quiet --bin tenplan
	$(VENV)/bin/python benches/fsdp2_reshard.py $(TARGET_DIR)/release/tenplan --json notebooks/fsdp2_reshard.json | tee notebooks/fsdp2_reshard.md

## A Megatron-Core job's state from tp=2,pp=2 to tp=1,pp=2,dp=2 on 4 gloo
## processes: tenplan live and checkpoint-to-checkpoint against Megatron's
## dist_checkpointing save + load, same run (needs the package: make python).
bench-megatron: setup
	cargo build $(LOCKED) --release --quiet --bin tenplan
	$(VENV)/bin/python benches/megatron_reshard.py $(TARGET_DIR)/release/tenplan --json notebooks/megatron_reshard.json | tee notebooks/megatron_reshard.md
	# With Megatron's distributed optimizer (a smaller model: two jobs and the
	# gathered optimizer state share the machine's memory).
	$(VENV)/bin/python benches/megatron_reshard.py $(TARGET_DIR)/release/tenplan --optimizer --layers 4 --vocab 16000 --json notebooks/megatron_optimizer_reshard.json | tee notebooks/megatron_optimizer_reshard.md

## Weight syncs of RL post-training (trainer -> inference engines, up to
## 768 GPUs on a rail-optimized fabric): every sync planner, and the picture.
bench-rl: setup
	cargo run --release --quiet -p tenplan-bench -- suite --suite rl --json notebooks/rl.json | tee notebooks/rl.md
	python3 notebooks/plan_quality.py notebooks/rl.json notebooks/rl.png

## NCCL M2N's published weight syncs on GB200 racks: the certified bound,
## broadcast and static-p2p on both; lp on Qwen3-235B's (its LP for
## DeepSeek-V3's did not finish in 15 minutes on 2 cores).
bench-m2n: setup
	cargo run $(LOCKED) --release --quiet -p tenplan-bench -- suite --suite m2n --planners broadcast,static-p2p --json $(TARGET_DIR)/m2n-baselines.json | tee $(TARGET_DIR)/m2n-baselines.md
	cargo run $(LOCKED) --release --quiet -p tenplan-bench -- suite --suite m2n --scenarios qwen3 --planners lp --json $(TARGET_DIR)/m2n-lp.json | tee $(TARGET_DIR)/m2n-lp.md
	python3 -c 'import json,sys; json.dump(sum((json.load(open(f)) for f in sys.argv[1:]), []), open("notebooks/m2n.json", "w"), indent=1)' $(TARGET_DIR)/m2n-baselines.json $(TARGET_DIR)/m2n-lp.json
	cat $(TARGET_DIR)/m2n-baselines.md $(TARGET_DIR)/m2n-lp.md > notebooks/m2n.md

## The plan-quality benchmark over both suites, and the README's picture.
bench: setup
	cargo run --release --quiet -p tenplan-bench -- suite --suite all --json notebooks/bench.json | tee notebooks/bench.md
	python3 notebooks/plan_quality.py notebooks/bench.json notebooks/plan_quality.png
	cargo run --release --quiet -p tenplan-bench -- switch --json notebooks/hotspa.json | tee notebooks/hotspa.md
	python3 notebooks/hotspa.py notebooks/hotspa.json notebooks/hotspa.png

## A checkpoint read back without tenplan (numpy + safetensors + xxhash), as DCP's reader does.
interop:
	rm -rf target/interop && mkdir -p target/interop
	cargo run $(LOCKED) --quiet --bin tenplan -- init --model llama-tiny --layout tp=2,pp=2,dp=2,zero=1 --out target/interop/a
	cargo run $(LOCKED) --quiet --bin tenplan -- reshard --src target/interop/a --to tp=4,dp=2 --out target/interop/b
	python3 scripts/read_checkpoint.py target/interop/a
	python3 scripts/read_checkpoint.py target/interop/b

## Every parser of outside input under the mutation fuzzer, ten minutes each
## (FUZZ_SECONDS to change); crashes and hangs are saved under target/fuzz/crashes.
FUZZ_SECONDS ?= 600
fuzz:
	cargo run --quiet -p tenplan-fuzz -- all --seconds $(FUZZ_SECONDS)

## A few seconds of each fuzz target (what CI runs).
fuzz-smoke:
	cargo run $(LOCKED) --quiet -p tenplan-fuzz -- all --seconds 5

## Executor throughput: host vs memcpy, reshard of GPT-3 350M vs PyTorch DCP and vs the disk.
## The scale suite (1k to 16k GPUs; each run its own process, 10 minutes at most):
## every planner at 1k and 4k GPUs, lp at 16k. Hours on 2 cores.
bench-scale: setup
	cargo build --release --quiet -p tenplan -p tenplan-bench
	target/release/tenplan-bench suite --suite scale --gpus 1024,4096 --timeout 300 --json target/scale-1k-4k.json | tee target/scale-1k-4k.md
	target/release/tenplan-bench suite --suite scale --gpus 16384 --planners lp --timeout 300 --json target/scale-16k.json | tee target/scale-16k.md
	python3 -c 'import json,sys; json.dump(sum((json.load(open(f)) for f in sys.argv[1:]), []), open("notebooks/scale.json", "w"), indent=1)' target/scale-1k-4k.json target/scale-16k.json
	cat target/scale-1k-4k.md target/scale-16k.md > notebooks/scale.md
	python3 notebooks/scale.py notebooks/scale.json notebooks/scale.png

## A torchtitan DeepSeek-V3 job's whole state (AdamW) on expert-parallel
## meshes, scaled up to 4,096 GPUs (~11 GB of memory at 4,096).
bench-mesh: setup
	cargo run $(LOCKED) --release --quiet -p tenplan-bench -- mesh-scale --gpus 256,1024,4096 --json notebooks/mesh_scale.json | tee notebooks/mesh_scale.md

bench-executor: setup
	cargo run --release --quiet -p tenplan-bench -- executor --reps 5 --json notebooks/executor.json | tee notebooks/executor.md

## Hugging Face import/export and diff: throughput and peak memory against cat and cp; sync.
bench-hf: setup
	cargo build --release --quiet --bin tenplan
	$${TENPLAN_VENV:-$$HOME/.cache/tenplan/venv}/bin/python benches/hf_io.py target/release/tenplan target/bench-hf --reps 5 --json notebooks/hf_io.json | tee notebooks/hf_io.md

## Run the notebook headless on a fresh paper-suite benchmark (what CI does).
notebook:
	mkdir -p target
	cargo run $(LOCKED) --quiet -p tenplan-bench -- suite --suite paper --json target/bench-paper.json > target/bench-paper.md
	python3 notebooks/plan_quality.py target/bench-paper.json target/plan_quality.png
	cargo run $(LOCKED) --quiet -p tenplan-bench -- switch --models llama2-7b --json target/hotspa.json > target/hotspa.md
	python3 notebooks/hotspa.py target/hotspa.json target/hotspa.png

## Regenerate the CUDA back end's box kernels (box_copy, box_reduce) as PTX
## (needs nvcc: the CUDA toolkit's, or PyPI's nvidia-cuda-nvcc with
## nvidia-nvvm, nvidia-cuda-runtime and nvidia-cuda-crt, as NVCC=...; the PTX
## is committed, so builds need no CUDA toolkit). PTX ISA 8.0 keeps it
## loadable by CUDA 12.0 drivers. The last line records the source's FNV-1a
## hash: a test fails when the PTX is older than the source.
NVCC ?= nvcc
cuda-ptx:
	$(NVCC) -O3 -arch=compute_75 -ptx executor/kernels/box_copy.cu -o executor/kernels/box_copy.ptx
	sed -i 's/^\.version .*/.version 8.0/' executor/kernels/box_copy.ptx
	python3 -c 'import sys; h = 0xcbf29ce484222325; b = open("executor/kernels/box_copy.cu", "rb").read(); \
	  [h := ((h ^ x) * 0x100000001b3) % 2**64 for x in b]; print(f"// source: box_copy.cu fnv1a64 {h:016x}")' >> executor/kernels/box_copy.ptx
