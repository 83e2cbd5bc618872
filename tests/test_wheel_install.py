"""The shipped taxonomies survive packaging: build a wheel, install it elsewhere, load them from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "taxonomies"

pytestmark = pytest.mark.slow


def shipped_files() -> list[Path]:
    if not SHIPPED.is_dir():
        return []
    return sorted(p for p in SHIPPED.iterdir() if p.name.endswith((".json.gz", ".json")) and not p.name.startswith("."))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shipped_files():
        pytest.skip("the checkout has no shipped taxonomy files in taxonomies/ yet")
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy, so that build/ and *.egg-info never land in the shared checkout.
    src = tmp / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".git",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".pytest_cache",
            ".ruff_cache",
            "runs",
            ".cache",
            "shared",
        ),
    )
    out = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (whl,) = out.glob("hiercls-*.whl")
    return whl


def test_wheel_contains_the_shipped_taxonomies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = [p.name for p in shipped_files() if f"hiercls/taxonomies/{p.name}" not in names]
    assert not missing, (
        f"{len(missing)} shipped taxonomy files are not in the wheel as hiercls/taxonomies/*: {missing[:5]}. "
        "[tool.setuptools.packages.find] does not discover 'hiercls.taxonomies' (it exists only through "
        "package-dir), so its package-data is dropped. Either list every package in [tool.setuptools] packages = "
        "[..., 'hiercls.taxonomies'], or drop packages.find from pyproject.toml and add a setup.py with "
        "setup(packages=[*find_namespace_packages(include=['hiercls*']), 'hiercls.taxonomies'])."
    )


def test_installed_wheel_loads_shipped_taxonomies(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        if not any(n.startswith("hiercls/taxonomies/") for n in zf.namelist()):
            pytest.fail("the wheel has no hiercls/taxonomies/ data (see test_wheel_contains_the_shipped_taxonomies)")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    expected = {}
    from hiercls.taxonomy import read_json

    for p in shipped_files():
        name = p.name.removesuffix(".gz").removesuffix(".json")
        expected.setdefault(name, read_json(p).fingerprint)
    script = (
        "import json, sys\n"
        # An editable install of the checkout hooks into sys.meta_path ahead of PYTHONPATH: drop it so the
        # installed wheel is what gets imported.
        "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]\n"
        "import hiercls\n"
        "from hiercls.taxonomy import list_taxonomies, load_taxonomy, taxonomy_path\n"
        "names = json.loads(sys.argv[1])\n"
        "out = {'hiercls': hiercls.__file__, 'listed': [e['name'] for e in list_taxonomies()], 'loaded': {}}\n"
        "for n in names:\n"
        "    out['loaded'][n] = [load_taxonomy(n).fingerprint, str(taxonomy_path(n))]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(sorted(expected))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hiercls"].startswith(str(site)), result["hiercls"]
    assert sorted(result["listed"]) == sorted(expected)
    for name, (fingerprint, path) in result["loaded"].items():
        assert fingerprint == expected[name], name
        assert path.startswith(str(site)), path
