"""The build's one addition to pyproject.toml: the package data of tuner.search_spaces and tuner.storage lies in
the repository's top-level folders of the same names, outside those packages (docs/architecture.md, "Where the
packages live"). setuptools reads package data only from inside a package's own folder."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

# Package: the folder its package data (pyproject.toml) is read from; the wheel puts the files in the package.
DATA_FOLDERS = {"tuner.search_spaces": "search_spaces", "tuner.storage": "storage"}


class BuildPyWithDataFolders(build_py):
    """build_py, reading the package data of the packages in DATA_FOLDERS from their folders."""

    # The one method that pairs a package with the folder of its data; the wheel, the sdist and an editable
    # install all list a package's data through it.
    def _get_pkg_data_files(self, package):
        if package not in DATA_FOLDERS:
            return super()._get_pkg_data_files(package)
        folder = DATA_FOLDERS[package]
        files = [os.path.relpath(path, folder) for path in self.find_data_files(package, folder)]
        return package, folder, os.path.join(self.build_lib, *package.split(".")), files


setup(cmdclass={"build_py": BuildPyWithDataFolders})
