#!/usr/bin/env bash
# Runs the test suite at the LOWEST declared versions of hiercls's pure-Python dependencies (constraints/lowest.txt)
# in a second venv, .venv-lowest, that reuses .venv's torch and everything else (scripts/setup.sh must have run).
# Packages installed in .venv-lowest shadow .venv's, because .venv's site-packages is added after its own.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "test_lowest: run scripts/setup.sh first" >&2; exit 2; }
if [ ! -x .venv-lowest/bin/python ] || [ constraints/lowest.txt -nt .venv-lowest/.installed ]; then
  echo "test_lowest: creating .venv-lowest with $(grep -v '^#' constraints/lowest.txt | tr '\n' ' ')"
  "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv .venv-lowest
  site=$(.venv-lowest/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir (not a bare path line) so that .venv's own .pth files, hiercls's editable finder among them, run too
  echo "import site; site.addsitedir('$main_site')" > "$site/zz_reuse_main_venv.pth"
  PIP_CONSTRAINT="$PWD/constraints/this-machine.txt" .venv-lowest/bin/python -m pip install -q \
    -r constraints/lowest.txt 2> >(grep -v "dependency resolver\|requires\|is ignored" >&2)
  touch .venv-lowest/.installed
fi
.venv-lowest/bin/python - <<'PY'
import importlib.metadata as md
print("test_lowest: " + ", ".join(f"{p} {md.version(p)}" for p in ("torch", "timm", "transformers", "torchmetrics", "networkx", "nltk")))
PY
exec .venv-lowest/bin/python -m pytest -q "$@"
