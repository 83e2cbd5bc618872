"""Only for the package list: ``taxonomies/`` and ``recipes/`` are installed as the packages ``hiercls.taxonomies``
and ``hiercls.recipes``.

``pyproject.toml`` maps the folders (``[tool.setuptools.package-dir]``), but automatic discovery cannot find a
package that exists only through that mapping, so the list is given here.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hiercls", "hiercls.*"]), "hiercls.taxonomies", "hiercls.recipes"])
