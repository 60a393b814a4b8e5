# tenplan: the two commands of the README, and their parts.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: setup demo test lint doc unit notebook bench

setup:
	@bash scripts/setup.sh

## Install what is missing, build in release mode, run the Tenplex paper scenarios.
demo: setup
	cargo run --release --quiet --bin tenplan -- demo

## Everything CI checks: formatting, lints, docs, the whole test suite, and
## the notebook on a fresh paper-suite benchmark.
test: setup lint doc unit notebook

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

unit:
	cargo test --workspace --all-targets
	cargo test --workspace --doc

## The plan-quality benchmark over both suites, and the README's picture.
bench: setup
	cargo run --release --quiet --bin tenplan -- bench --suite all --json notebooks/bench.json
	python3 notebooks/plan_quality.py notebooks/bench.json notebooks/plan_quality.png

## Run the notebook headless on a fresh paper-suite benchmark (what CI does).
notebook:
	mkdir -p target
	cargo run --quiet --bin tenplan -- bench --suite paper --json target/bench-paper.json > target/bench-paper.md
	python3 notebooks/plan_quality.py target/bench-paper.json target/plan_quality.png
