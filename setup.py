"""Build shardwise: CMake builds the torch-free core and the shardwise._C extension.

    pip install --no-build-isolation .      (or -e . for development)

Environment: SHARDWISE_BUILD_TYPE (Release|Debug|RelWithDebInfo, default Release),
SHARDWISE_JOBS (parallel compile jobs, default 2).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


def _cmake() -> str:
    """The CMake of this Python's ``cmake`` package (PyPI) where it has one, else the one on
    PATH. scripts/install.sh installs that package, and scripts/check_pip_install.sh the same
    version into its fresh venv, so both builds write their compile commands with one CMake:
    CMake versions order the flags differently (-std=c++20 before or after the target's
    options), and ccache, which hashes the command line, then reused nothing between them."""
    try:
        import cmake
    except ImportError:
        return "cmake"
    binary = Path(cmake.CMAKE_BIN_DIR) / "cmake"
    return str(binary) if binary.exists() else "cmake"


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch  # the build compiles against the installed torch (no build isolation)

        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = ROOT / "build" / "python"
        # A fixed output folder, so `cmake --build build/python --target _C` during
        # development writes where scripts/rebuild-ext.sh copies from.
        lib_dir = build_dir / "lib"
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("SHARDWISE_BUILD_TYPE", "Release")
        cmake = _cmake()
        args = [
            cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={lib_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DSHARDWISE_BUILD_PYTHON=ON",
            "-DSHARDWISE_BUILD_TESTS=OFF",
            f"-DSHARDWISE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        ]
        # scripts/test.sh sets it: the core's files then compile with the flags of its own core
        # build (build/core, -Werror), so that build and the fresh venv's reuse these objects
        # from the compiler cache instead of compiling the core again.
        if os.environ.get("SHARDWISE_WERROR") == "1":
            args.append("-DSHARDWISE_WERROR=ON")
        subprocess.run(args, check=True)
        jobs = os.environ.get("SHARDWISE_JOBS", "2")
        subprocess.run([cmake, "--build", str(build_dir), "--target", "_C", "-j", jobs], check=True)
        built = lib_dir / target.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)


setup(
    name="shardwise",
    version="0.1.0",
    description="Automatic data, tensor and pipeline parallelism for PyTorch models",
    python_requires=">=3.10",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("shardwise._C")],
    cmdclass={"build_ext": CMakeBuild},
    # torch is not pinned here: the wheel must work with the torch of the machine it
    # is built on (2.13 CPU here, 2.11+cu130 on the GPU machine). Install scripts pin.
    # numpy: torch.distributed's *_object collectives (Cluster.detect, the engine's consensus)
    # serialise through it, and torch's wheel does not require it (a fresh venv failed there).
    install_requires=["torch>=2.11", "rich>=13", "numpy"],
    extras_require={"test": ["pytest", "transformers>=4.45", "accelerate>=1.1"],
                    "transformers": ["transformers>=4.45", "accelerate>=1.1"]},
    entry_points={"console_scripts": ["shardwise=shardwise.__main__:main"]},
    zip_safe=False,
)
