#!/usr/bin/env bash
# Install what a fresh machine lacks to build and test tenplan. Idempotent:
# it installs only what is missing. Needs root (or sudo) for apt-get.
set -euo pipefail

# HiGHS (the LP solver) is compiled from source by highs-sys: it needs cmake
# and a C++ compiler, and bindgen needs the libclang shared library. Install
# both before the first build, or it fails only after HiGHS has compiled.
need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if ! ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so'; then
  need_apt+=(libclang1-14)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo=sudo
  echo "setup: installing ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no Rust toolchain found; install one with rustup (https://rustup.rs), Rust >= 1.88" >&2
    exit 1
  fi
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 && rustup component add "$c"
  fi
done
# The notebook draws with matplotlib.
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "setup: installing matplotlib"
  python3 -m pip install -q -r "$(dirname "$0")/../notebooks/requirements.txt"
fi
# The interoperability check reads checkpoints with numpy, safetensors and xxhash.
if ! python3 -c 'import numpy, safetensors, xxhash' >/dev/null 2>&1; then
  echo "setup: installing numpy, safetensors, xxhash"
  python3 -m pip install -q -r "$(dirname "$0")/requirements.txt"
fi
# torch and transformers, for the tests against real Hugging Face models
# (tests/hf_models.rs), in a virtual environment kept outside the clone.
venv="${TENPLAN_VENV:-$HOME/.cache/tenplan/venv}"
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors' >/dev/null 2>&1; then
  echo "setup: installing torch and transformers into $venv (a ~3 GB download, once)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$(dirname "$0")/requirements-torch.txt"
fi
# megatron-core writes and loads the torch_dist checkpoints of tests/megatron/.
if ! "$venv/bin/python" -c 'import megatron.core, psutil' >/dev/null 2>&1; then
  echo "setup: installing megatron-core into $venv"
  "$venv/bin/pip" install -q --no-deps -r "$(dirname "$0")/requirements-megatron.txt"
fi
# torchtitan writes the checkpoints of tests/torchtitan/ with its own Llama 3
# and converts them with its own state-dict adapter.
if ! "$venv/bin/python" -c 'import torchtitan.models.llama3.state_dict_adapter, torchdata.stateful_dataloader' >/dev/null 2>&1; then
  echo "setup: installing torchtitan into $venv"
  "$venv/bin/pip" install -q --no-deps -r "$(dirname "$0")/requirements-torchtitan.txt"
fi
# maturin builds the Python package's wheel (PyO3, abi3); mypy checks its stubs.
if ! "$venv/bin/maturin" --version >/dev/null 2>&1 || ! "$venv/bin/python" -c 'import mypy.stubtest' >/dev/null 2>&1; then
  echo "setup: installing maturin and mypy into $venv"
  "$venv/bin/pip" install -q -r "$(dirname "$0")/requirements-python.txt"
fi
echo "setup: $(cargo --version), $("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
