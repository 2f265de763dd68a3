"""Package discovery for certify (everything else is in pyproject.toml).

Packages are found, never listed: every folder under ``certify/`` with an ``__init__.py`` is a
package, and so is every such folder under ``templates/`` and ``suites/``, which ship as
``certify._templates`` and ``certify._suites``. A new subpackage therefore cannot be left out of
the wheel; ``tests/test_wheel.py`` checks the built wheel against the source tree.
"""

from setuptools import find_packages, setup

# Top-level folders of the repository shipped inside the certify package, as data packages.
MAPPED = {"certify._templates": "templates", "certify._suites": "suites"}

packages = find_packages(include=["certify", "certify.*"])
package_dir = dict(MAPPED)
for name, folder in MAPPED.items():
    packages.append(name)
    for sub in find_packages(where=folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
