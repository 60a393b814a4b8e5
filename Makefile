# tenplan: the two commands of the README, and their parts.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: setup demo test lint doc unit

setup:
	@bash scripts/setup.sh

## Install what is missing, build in release mode, run the Tenplex paper scenarios.
demo: setup
	cargo run --release --quiet --bin tenplan -- demo

## Everything CI checks: formatting, lints, docs, and the whole test suite.
test: setup lint doc unit

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

unit:
	cargo test --workspace --all-targets
	cargo test --workspace --doc
