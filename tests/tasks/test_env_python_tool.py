"""The Python runner of the math-tool environments: each way model code can go wrong becomes an error
reply, the run never hangs (pytest-timeout bounds every test), and nothing outside its directory is
touched. Limits are small (1-2 s) so the file runs in a few seconds. The hostile probes (code written to
get out) are in test_env_sandbox_probes.py; the sandbox's start-up checks in test_env_sandbox.py."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from arlopti.tasks.env.python_tool import PythonLimits, run_python

pytestmark = pytest.mark.timeout(60)
FAST = PythonLimits(cpu_s=1, wall_s=2, memory_mb=512, max_output_bytes=4096)


@pytest.mark.process


def test_output_last_expression_and_no_state_between_runs():
    r = run_python("x = 6\nprint('x is', x)\nx * 7", FAST)
    assert (r.status, r.exit_code, r.reply()) == ("ok", 0, "x is 6\n42\n")
    again = run_python("print(x)", FAST)  # every call is a fresh interpreter
    assert again.status == "error" and "NameError: name 'x' is not defined" in again.reply()
    assert run_python("None", FAST).output == ""  # a None value is not echoed, as in a notebook
    assert run_python("1 + 1", FAST, echo_last=False).output == ""


@pytest.mark.process


def test_an_exception_or_a_syntax_error_is_the_reply():
    r = run_python("def f():\n    return 1 / 0\nf()", FAST)
    assert r.status == "error" and r.exit_code == 1
    assert 'File "main.py", line 2, in f' in r.output and r.output.rstrip().endswith("division by zero")
    assert "<string>" not in r.output  # the runner's own frame is left out
    syntax = run_python("def f(:\n    pass", FAST)
    assert syntax.status == "error" and "SyntaxError" in syntax.reply() and 'File "main.py", line 1' in syntax.output


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(600)",
                                  "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(600)"],
                         ids=["busy_loop", "sleeping_loop", "closed_stdout"])
@pytest.mark.process
def test_an_infinite_loop_is_stopped(code):
    r = run_python(f"print('started')\n{code}", PythonLimits(cpu_s=1, wall_s=1))
    assert r.status == "timeout" and r.timed_out
    assert "TimeoutError: the code was stopped" in r.reply()
    if "close" not in code:
        assert r.reply().startswith("started\n")  # unbuffered: what it printed before is kept


@pytest.mark.process


def test_new_processes_run_inside_and_signals_reach_only_the_sandbox():
    r = run_python("import subprocess\nprint(subprocess.run(['/bin/echo', 'child'], capture_output=True).stdout)", FAST)
    assert (r.status, r.output) == ("ok", "b'child\\n'\n")
    # PID 1 is the sandbox's own init: killing it ends this run, and nothing outside.
    killed = run_python("import os, signal\nprint(os.getpid(), os.getppid(), flush=True)\nos.kill(1, signal.SIGKILL)\n"
                        "import time\ntime.sleep(5)", FAST)
    assert killed.output.split() == ["2", "1"] and killed.status != "ok"


@pytest.mark.parametrize("code", ["x = bytearray(64 * 2**30)",
                                  "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"],
                         ids=["one_block", "growing"])
@pytest.mark.process
def test_a_memory_hog_gets_a_memory_error(code):
    r = run_python(code, PythonLimits(cpu_s=2, wall_s=4, memory_mb=256))
    assert r.status == "memory" and "MemoryError" in r.output and "(memory limit: 256 MB)" in r.reply()


@pytest.mark.parametrize("code", ["print('x' * 100_000_000)", "for _ in range(10**6):\n    print('y' * 100)"],
                         ids=["one_print", "many_prints"])
@pytest.mark.process
def test_a_100_mb_print_is_cut_at_the_output_limit(code):
    r = run_python(code, FAST)
    assert r.status == "output_limit" and len(r.output.encode()) <= FAST.max_output_bytes
    assert r.reply().endswith("[output truncated: more than 4096 bytes; the code was stopped]")


@pytest.mark.process


def test_a_large_file_is_refused_by_the_file_size_limit():
    r = run_python("open('big.bin', 'wb').write(b'x' * (4 * 2**20))", PythonLimits(cpu_s=1, wall_s=2, max_file_mb=1))
    assert r.status == "error" and "File too large" in r.output


@pytest.fixture
def outside(tmp_path):
    """A directory outside the runner's, holding one file; returns it and its listing."""
    (tmp_path / "keep.txt").write_text("original")
    return tmp_path


WRITES = {
    "create": "open(r'{d}/new.txt', 'w').write('x')",
    "overwrite": "open(r'{d}/keep.txt', 'w').write('x')",
    "append_os_open": "import os\nos.open(r'{d}/keep.txt', os.O_WRONLY | os.O_APPEND)",
    "remove": "import os\nos.remove(r'{d}/keep.txt')",
    "rename_out": "open('mine.txt', 'w').write('x')\nimport os\nos.rename('mine.txt', r'{d}/new.txt')",
    "through_symlink": "import os\nos.symlink(r'{d}', 'link')\nopen('link/keep.txt', 'w').write('x')",
    "hard_link": "import os\nos.link(r'{d}/keep.txt', 'linked.txt')",
    "parent_dir": "open('../escaped.txt', 'w').write('x')",
    "rmtree": "import shutil\nshutil.rmtree(r'{d}')",
    "pathlib": "import pathlib\npathlib.Path(r'{d}/new.txt').write_text('x')",
}


@pytest.mark.parametrize("name", sorted(WRITES))
@pytest.mark.process
def test_a_write_outside_its_directory_fails(outside, name):
    r = run_python(WRITES[name].format(d=outside), FAST)
    if name == "parent_dir":  # lands in the sandbox's private /tmp, gone with it
        assert r.status == "ok" and not os.path.exists(os.path.join(tempfile.gettempdir(), "escaped.txt"))
    else:
        assert r.status == "error" and ("Read-only file system" in r.output or "No such file" in r.output), r.output
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "original"


@pytest.mark.process


def test_its_own_directory_is_writable_and_removed_afterwards():
    r = run_python("import os\nopen('a.txt', 'w').write('hi')\nos.mkdir('sub')\nos.rename('a.txt', 'sub/b.txt')\n"
                   "print(open('sub/b.txt').read(), os.getcwd())", FAST)
    assert r.status == "ok", r.output
    text, workdir = r.output.split()
    assert text == "hi" and not os.path.exists(workdir)


@pytest.mark.process


def test_networking_reaches_nothing():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
                     f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)",
                     "import urllib.request\nurllib.request.urlopen('http://pypi.org/', timeout=1)"):
            r = run_python(code, FAST)
            assert r.status == "error" and ("Connection refused" in r.output or "unreachable" in r.output
                                            or "Name or service not known" in r.output
                                            or "Temporary failure in name resolution" in r.output), r.output
        with pytest.raises(socket.timeout):
            listener.accept()  # nobody connected


@pytest.mark.process


def test_the_environment_is_stripped(monkeypatch):
    monkeypatch.setenv("ARLOPTI_TEST_SECRET", "hunter2")
    r = run_python("import os, sys\nprint(sorted(os.environ))\nprint(os.environ['HOME'] == os.getcwd())\n"
                   "print(sys.flags.isolated, sys.flags.dont_write_bytecode)", FAST)
    assert r.status == "ok" and "ARLOPTI_TEST_SECRET" not in r.output and "hunter2" not in r.output
    assert r.output.splitlines()[1:] == ["True", "1 1"]


@pytest.mark.process


def test_packages_of_this_environment_import():
    r = run_python("import sympy\nx = sympy.symbols('x')\nsorted(sympy.solve(x**2 - 4, x))",
                   PythonLimits(cpu_s=5, wall_s=20))
    assert (r.status, r.output) == ("ok", "[-2, 2]\n")


@pytest.mark.process


def test_without_the_sandbox_the_limits_still_hold(tmp_path):
    r = run_python("import os\nprint(os.path.isdir('/etc'))\nwhile True:\n    pass", PythonLimits(cpu_s=1, wall_s=2),
                   sandbox=False)
    assert r.status == "timeout" and r.output.startswith("True")  # the host's files: no sandbox


@pytest.mark.parametrize("field", ["cpu_s", "wall_s", "memory_mb", "max_output_bytes", "max_file_mb",
                                   "max_processes"])
def test_bad_limits_are_refused_by_name(field):
    with pytest.raises(ValueError, match=f"PythonLimits.{field}"):
        PythonLimits(**{field: 0})
