#!/usr/bin/env bash
# Downloads into .whl/ (ignored by git) the wheels `python -m efftx.gpu_bench` needs on a GPU machine that has jax
# with CUDA, flax, optax, orbax-checkpoint, torch, transformers and matplotlib but not the rest of efftx's
# dependencies: efftx.ab imports efftx.trainer, which imports efftx.data, which imports tensorflow_datasets; efftx's
# configs are ml_collections. Everything else that tensorflow_datasets imports at import time is below; what it
# imports only to build or read a dataset (grain, array_record, dm-tree, simple_parsing, termcolor) is not needed.
# jax, jaxlib, flax, optax, numpy, protobuf and torch are never carried: the machine's own are used.
# Run from anywhere; the wheels are for CPython 3.12 on x86-64 Linux (pure Python, so any 3.x works).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$repo/.whl"
rm -rf "$dest" && mkdir -p "$dest"
download=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$dest")
"${download[@]}" \
  ml_collections==1.1.0 \
  tensorflow-datasets==4.9.10 \
  tensorflow-metadata==1.17.3 \
  immutabledict==4.3.1 \
  toml==0.10.2
# wrapt's pure-Python wheel (its C extension is optional): the same file for any Python 3.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any -d "$dest" wrapt==2.1.2
# promise is published as a source archive only: built here into a pure-Python wheel.
python3 -m pip wheel -q --no-deps -w "$dest" promise==2.3
ls -l "$dest"
du -sh "$dest"
