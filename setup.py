"""Package discovery for setuptools (the rest of the metadata is in pyproject.toml).

Every package under gh200rt/ is found, and the top-level numa/ and kernels/ folders install as
gh200rt.numa and gh200rt.kernels (DESIGN.md, Layout), their subpackages included: a package added
anywhere is shipped by a regular wheel without editing a list, and so is a folder of data files (package-data
in pyproject.toml names its files).
"""
from setuptools import find_namespace_packages, find_packages, setup

MAPPED_FOLDERS = ("numa", "kernels")    # top-level folders installed under the gh200rt namespace


def discovered() -> tuple[list[str], dict[str, str]]:
    packages = find_packages(include=["gh200rt", "gh200rt.*"])
    package_dir = {"gh200rt": "gh200rt"}
    for folder in MAPPED_FOLDERS:
        package_dir[f"gh200rt.{folder}"] = folder
        packages += [f"gh200rt.{name}" for name in find_packages(include=[folder, f"{folder}.*"])]
        # folders of data only (kernels/cpu: the native C sources): packages too, so their files ship as package data
        packages += [f"gh200rt.{name}" for name in find_namespace_packages(include=[f"{folder}.*"],
                                                                         exclude=["*__pycache__*"])
                     if f"gh200rt.{name}" not in packages]
    return sorted(packages), package_dir


packages, package_dir = discovered()
setup(packages=packages, package_dir=package_dir)
