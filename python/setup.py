"""Build the bytescale package: copy the C library into it.

The package is Python over the shared library (ctypes); nothing is compiled here. The library is
found by, in this order:
  $BYTESCALE_LIB                  the file libbytescale.so.0 itself (a build tree: build/libbytescale.so.0)
  pkg-config --variable=libdir bytescale
                                  an installed library (`make install PREFIX=...`; a prefix pkg-config
                                  does not search needs PKG_CONFIG_PATH=PREFIX/lib/pkgconfig)
and copied into the package, so the installed package needs neither afterwards. The package's
version is the library's (bs_version()).
"""

import ctypes
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

LIB_NAME = "libbytescale.so.0"


def find_library():
    env = os.environ.get("BYTESCALE_LIB")
    if env:
        if not os.path.isfile(env):
            raise SystemExit(f"bytescale: BYTESCALE_LIB={env}: no such file (it names libbytescale.so.0 itself)")
        return env
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "bytescale"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        libdir = ""
    candidate = os.path.join(libdir, LIB_NAME)
    if libdir and os.path.isfile(candidate):
        return os.path.normpath(candidate)
    raise SystemExit(
        "bytescale: libbytescale.so.0 not found. Build and install the C library first (make install PREFIX=...; "
        "then PKG_CONFIG_PATH=PREFIX/lib/pkgconfig if pkg-config does not search PREFIX), or set "
        "BYTESCALE_LIB=/path/to/libbytescale.so.0 (README.md, 'The Python package').")


LIB = find_library()
_clib = ctypes.CDLL(LIB)
_clib.bs_version.restype = ctypes.c_char_p
VERSION = _clib.bs_version().decode()


class BuildWithLibrary(build_py):
    """build_py, then the library beside the modules (the package loads its own copy first)."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "bytescale", LIB_NAME)
        shutil.copyfile(LIB, dest)  # the file itself, not a symbolic link to it
        os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(version=VERSION, cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
