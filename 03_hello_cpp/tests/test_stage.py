"""Stage 03's tests: hello() prints from C++, by both build routes.

C++ writes to file descriptor 1 directly, past Python's sys.stdout: pytest's `capfd`
(file-descriptor capture) sees the line, `capsys` (sys.stdout capture) does not.
"""

import os

import eml.hello_cpp
from eml.hello_cpp import hello, jit


def test_hello_prints_from_cpp(capfd):
    assert hello() is None
    out, err = capfd.readouterr()
    assert out == "Hello World!\n"
    assert err == ""


def test_cpp_output_bypasses_sys_stdout(capsys):
    print("from Python")
    hello()  # goes to file descriptor 1, which pytest's own capture swallows here
    assert capsys.readouterr().out == "from Python\n", "sys.stdout should not see C++'s std::cout"


def test_extension_is_a_compiled_module_in_the_package():
    compiled = eml.hello_cpp._C
    assert compiled.__file__.endswith(".so")
    assert compiled.__name__ == "eml.hello_cpp._C"
    assert "Print 'Hello World!' from C++" in compiled.hello.__doc__  # m.def's docstring, not just the signature


def build_in_background(folder):
    """The test below's JIT build, which the root conftest.py starts as the session begins, so
    that it compiles while other tests run (see there)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    jit.build()


def test_jit_route_builds_into_the_given_directory(background_builds, monkeypatch, capfd):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(background_builds))
    module = jit.build()  # built by build_in_background above, or by this call
    assert (background_builds / "hello_cpp_jit").is_dir()
    assert str(background_builds) in module.__file__
    capfd.readouterr()
    module.hello()
    assert capfd.readouterr().out == "Hello World!\n"
