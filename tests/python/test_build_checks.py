"""Builds that cannot go wrong silently (issue 15): CMake refuses, with a message saying what to do,
a compiler whose libstdc++ is newer than the one Python loads, and a Python without torch."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def _fake_compiler(tmp_path, glibcxx):
    """A wrapper around g++ that reports a libstdc++ exporting up to GLIBCXX_<glibcxx> (as a second
    GCC installation's would)."""
    lib = tmp_path / "libstdc++.so.6"
    lib.write_text(f"GLIBCXX_3.4\nGLIBCXX_{glibcxx}\n")
    wrapper = tmp_path / "g++-wrapper"
    wrapper.write_text(f"#!/bin/sh\n[ \"$1\" = -print-file-name=libstdc++.so.6 ] && {{ echo {lib}; exit 0; }}\n"
                       "exec g++ \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def _check(compiler):
    return subprocess.run([CMAKE, f"-DCOMPILER={compiler}", f"-DPYTHON={sys.executable}", "-P",
                           os.path.join(ROOT, "cmake", "MeshfuserCheckLibstdcxx.cmake")],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compiler_with_newer_libstdcxx_is_refused_naming_the_compiler_to_use(tmp_path):
    wrapper = _fake_compiler(tmp_path, "3.4.99")
    r = _check(wrapper)
    assert r.returncode != 0
    msg = " ".join((r.stdout + r.stderr).split())
    assert wrapper in msg and "GLIBCXX_3.4.99" in msg, msg
    assert "CXX=" in msg and "pip install --no-build-isolation ." in msg, msg
    suggested = msg.split("CXX=")[1].split()[0]
    assert os.path.basename(suggested) in ("g++", "c++"), msg


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_compiler_with_older_libstdcxx_is_accepted(tmp_path):
    assert _check(_fake_compiler(tmp_path, "3.4.1")).returncode == 0
    assert _check(shutil.which("g++")).returncode == 0


def test_python_without_torch_is_refused_with_the_libtorch_route(tmp_path):
    other = "/usr/bin/python3"
    if not os.path.exists(other) or subprocess.run([other, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("needs a Python without torch")
    r = subprocess.run([CMAKE, "-S", ROOT, "-B", str(tmp_path / "build"), "-DMESHFUSER_BUILD_TESTS=OFF",
                        f"-DPython_EXECUTABLE={other}"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    msg = " ".join((r.stdout + r.stderr).split())
    assert "cannot" in msg and "MESHFUSER_BUILD_PYTHON=OFF" in msg and "Torch_DIR" in msg, msg


def test_module_that_does_not_import_fails_the_build(tmp_path):
    # The post-build step imports the module in a fresh Python; one that crashes or fails there
    # fails the build, naming the compiler and the one to use.
    bogus = tmp_path / "_C.so"
    bogus.write_text("not a shared object")
    r = subprocess.run([CMAKE, f"-DPYTHON={sys.executable}", f"-DMODULE={bogus}", "-DCOMPILER=/opt/other-gcc/bin/g++",
                        "-P", os.path.join(ROOT, "cmake", "MeshfuserImportCheck.cmake")], capture_output=True, text=True)
    assert r.returncode != 0
    message = " ".join(r.stderr.split())  # CMake wraps long messages
    assert "the module built by /opt/other-gcc/bin/g++ does not import or crashes when used" in message, message
    assert "CXX=/usr/bin/g++" in message, message


def test_module_that_imports_passes_the_post_build_check():
    import meshfuser
    module = meshfuser._C.__file__
    r = subprocess.run([CMAKE, f"-DPYTHON={sys.executable}", f"-DMODULE={module}", "-DCOMPILER=g++", "-P",
                        os.path.join(ROOT, "cmake", "MeshfuserImportCheck.cmake")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_pip_build_picks_the_gxx_on_path_not_an_image_wide_cxx(tmp_path):
    # pip install (scikit-build-core sets SKBUILD) configures afresh each time with the g++ on PATH,
    # as scripts/setup does: a CXX pointing at another GCC (or at nothing) does not stick.
    env = dict(os.environ, CXX=str(tmp_path / "no-such-g++"))
    env.pop("MESHFUSER_CXX", None)
    r = subprocess.run([CMAKE, "-S", ROOT, "-B", str(tmp_path / "build"), "-DSKBUILD=ON", "-DMESHFUSER_BUILD_TESTS=OFF",
                        f"-DPython_EXECUTABLE={sys.executable}"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    import glob
    import re
    (found,) = glob.glob(str(tmp_path / "build" / "CMakeFiles" / "*" / "CMakeCXXCompiler.cmake"))
    with open(found) as f:
        compiler = re.search(r'set\(CMAKE_CXX_COMPILER "([^"]+)"\)', f.read()).group(1)
    assert os.path.realpath(compiler) == os.path.realpath(shutil.which("g++")), compiler


def test_pyproject_declares_torch_and_keeps_no_build_folder():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert '"torch>=2.11"' in text, text
    assert "build-dir" not in text, text  # a persistent folder would keep a failed build's compiler
