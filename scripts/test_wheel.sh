#!/usr/bin/env bash
# Tests hiercls as a user installs it: builds the sdist and the wheel with `python -m build` (the wheel is built
# from the sdist, so both are checked), installs the wheel with its [test] extra into a new, empty venv WITHOUT the
# constraints/ files (pip takes the newest releases that pyproject.toml's ranges allow; not the [assets] extra, so
# the tests that need it must skip), and runs the installed-package tests there, from a folder outside the checkout,
# so that `import hiercls` is the installed copy. Extra arguments go to pytest. Everything lives in one temporary
# folder (several GB: torch), removed at the end; HIERCLS_WHEEL_KEEP=1 keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/hiercls-wheel.XXXXXX")
[ "${HIERCLS_WHEEL_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
unset PIP_CONSTRAINT PYTHONPATH
stamp() { echo "test_wheel: $(date -u +%H:%M:%S) $*"; }
# pip names every local index folder that lacks a package ("Location ... is ignored"): noise, dropped.
pip_quiet() { "$py" -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

stamp "creating a clean venv in $work/venv"
"${PYTHON:-python3}" -m venv "$work/venv"
py=$work/venv/bin/python
pip_quiet install -q --upgrade pip build
stamp "building the sdist and the wheel"
"$py" -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/hiercls-*.whl)
stamp "installing $(basename "$wheel")[test] and its newest dependencies"
pip_quiet install -q "$wheel[test]"
"$py" - <<'PY'
import importlib.metadata as md
print("test_wheel: " + ", ".join(f"{p} {md.version(p)}" for p in ("hiercls", "torch", "timm", "transformers", "torchmetrics", "numpy", "numba")))
PY
stamp "running the installed-package tests"
tests=(test_wheel_install.py test_train_recipes.py test_taxonomy_cli.py test_shipped_taxonomies.py
  test_integrations_timm.py test_models.py test_prompt_heads.py test_multilabel_text.py)
cd "$work"
set +e
HIERCLS_DIST="$work/dist" "$py" -m pytest -q -p no:cacheprovider --rootdir "$root" -c "$root/pyproject.toml" \
  "${tests[@]/#/$root/tests/}" "$@"
rc=$?
stamp "done (pytest exit $rc)"
exit "$rc"
