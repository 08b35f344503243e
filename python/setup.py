"""pip install ./python — deloco for PyTorch (docs/python.md).

The extension is built by the project's CMake (the same sources as build/python), against the torch of the Python
that runs pip. Without build isolation, so that torch is importable here:

    pip install --no-build-isolation ./python

Where it builds: $DELOCO_BUILD_DIR when set; else the project's build/ when that was configured for this very
Python (scripts/setup.sh with Debian's python3-torch: only the module is linked); else build-python/ (a full build of
the libraries against this Python's torch: tens of minutes on 2 cores). CMAKE_PREFIX_PATH defaults to this torch's
CMake files (torch.utils.cmake_prefix_path), so a pip-installed torch of another version is used consistently.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def configured_for_this_python(build):
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.exists(cache):
        return False
    with open(cache) as f:
        for line in f:
            if line.startswith("Python_EXECUTABLE:"):
                return os.path.realpath(line.split("=", 1)[1].strip()) == os.path.realpath(sys.executable)
    return False


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch

        build = os.environ.get("DELOCO_BUILD_DIR")
        if not build:
            default = os.path.join(ROOT, "build")
            build = default if configured_for_this_python(default) else os.path.join(ROOT, "build-python")
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            prefix = os.environ.get("CMAKE_PREFIX_PATH", torch.utils.cmake_prefix_path)
            args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DDELOCO_BUILD_TESTS=OFF",
                    "-DDELOCO_BUILD_BENCH=OFF", "-DPython_EXECUTABLE=" + sys.executable, "-DCMAKE_PREFIX_PATH=" + prefix]
            if shutil.which("ninja"):
                args += ["-G", "Ninja"]
            subprocess.check_call(args)
        subprocess.check_call(["cmake", "--build", build, "--target", "deloco_python", "-j", str(os.cpu_count() or 1)])
        built = glob.glob(os.path.join(build, "python", "deloco", "_deloco*.so"))
        if not built:
            raise RuntimeError(f"the build in {build} made no deloco/_deloco*.so: is pybind11 (pybind11-dev) installed?")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy(built[0], dest)


setup(
    name="deloco",
    version="0.1.0",
    description="Decoupled DiLoCo learners for PyTorch training loops, on deloco's C++ runtime",
    packages=["deloco"],
    ext_modules=[Extension("deloco._deloco", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
)
