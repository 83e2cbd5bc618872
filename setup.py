"""Only for the package list: ``taxonomies/`` is installed as the package ``hiercls.taxonomies``.

``pyproject.toml`` maps the folder (``[tool.setuptools.package-dir]``), but automatic discovery cannot find a
package that exists only through that mapping, so the list is given here.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["hiercls", "hiercls.*"]), "hiercls.taxonomies"])
