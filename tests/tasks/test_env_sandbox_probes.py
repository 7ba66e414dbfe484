"""Hostile code against the Python tool (issue 42's table): each probe is what a policy under training could
write, given to both contracts (``MathToolEnv.step`` and ``MathPythonTool.python``). Each one got past the
old in-process guard; under the OS sandbox nothing outside is created, deleted, connected or read, nothing
is left running, and the trainer lives. The probes that need a trainer of their own (its environment's
secret, a signal to it) run in a stand-in trainer process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from arlopti.tasks.env.math_tool import MathPythonTool, MathToolEnv
from arlopti.tasks.env.python_tool import PythonLimits

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]
LIMITS = PythonLimits(cpu_s=2, wall_s=5, memory_mb=512, max_output_bytes=8192)
SECRET = "arlopti-test-secret-" + uuid.uuid4().hex


class TextEnv(MathToolEnv):
    limits = LIMITS


class ToolEnv(MathPythonTool):
    limits = LIMITS


def _text_contract(code: str) -> str:
    env = TextEnv()
    env.reset({})
    reply, done, _ = env.step(f"Let me run it.\n```python\n{code}\n```\n")
    assert not done
    return reply


def _tool_contract(code: str) -> str:
    env = ToolEnv()
    env.reset()
    return env.python(code)


CONTRACTS = {"text_step": _text_contract, "trl_python": _tool_contract}


@pytest.fixture(params=sorted(CONTRACTS))
def run(request):
    return CONTRACTS[request.param]


@pytest.fixture
def outside(tmp_path):
    """A folder outside the tool's directory, holding a victim file and a planted secret."""
    (tmp_path / "victim.txt").write_text("original")
    (tmp_path / "secret.txt").write_text(SECRET)
    return tmp_path


def _listing(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


UNTOUCHED = {"secret.txt": SECRET, "victim.txt": "original"}


def test_os_open_with_a_dir_fd_outside_creates_nothing(run, outside):
    run(f"import os\nd = os.open(r'{outside}', os.O_RDONLY)\n"
        "os.write(os.open('created.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d), b'x')")
    assert _listing(outside) == UNTOUCHED


def test_unlink_with_a_dir_fd_outside_deletes_nothing(run, outside):
    run(f"import os\nd = os.open(r'{outside}', os.O_RDONLY)\nos.unlink('victim.txt', dir_fd=d)")
    assert _listing(outside) == UNTOUCHED


def test_sqlite_creates_no_database_outside(run, outside):
    run(f"import sqlite3\nc = sqlite3.connect(r'{outside}/m.db')\nc.execute('create table t (x)')\nc.commit()")
    assert _listing(outside) == UNTOUCHED


def test_ctypes_writes_nothing_outside(run, outside):
    run("import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        f"fd = libc.open(b'{outside}/ctypes.txt', os.O_WRONLY | os.O_CREAT, 0o644)\nprint(libc.write(fd, b'x', 1))")
    assert _listing(outside) == UNTOUCHED


def test_ctypes_connect_reaches_no_listener(run):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        code = ("import ctypes, socket, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(socket.AF_INET, "
                "socket.SOCK_STREAM, 0)\naddr = struct.pack('<H', socket.AF_INET) + struct.pack('>H', "
                f"{port}) + socket.inet_aton('127.0.0.1') + bytes(8)\nprint('connect', libc.connect(fd, addr, 16))\n"
                f"socket.create_connection(('127.0.0.1', {port}), timeout=1)")
        reply = run(code)
        assert "connect -1" in reply and "Error" in reply, reply
        with pytest.raises(socket.timeout):
            listener.accept()  # nobody connected


def test_no_file_outside_is_readable(run, outside):
    reply = run(f"for p in ('/etc/passwd', r'{outside}/secret.txt', r'{__file__}', '/etc/hostname'):\n"
                "    try:\n        print(open(p).read())\n    except OSError as err:\n        print(type(err).__name__)")
    assert SECRET not in reply and "root:" not in reply and "pytest" not in reply
    assert reply.count("FileNotFoundError") == 4, reply


def test_only_the_interpreter_and_the_working_directory_are_visible(run):
    reply = run("import os, sys\nprint(sorted(os.listdir('/')))\nprint(sorted(os.listdir('/tmp')))\n"
                "print(os.path.basename(os.getcwd()), os.getcwd().startswith('/tmp/'))\n"
                "print(os.access(sys.prefix, os.W_OK), os.access('/usr', os.W_OK))")
    roots = [Path(p) for p in (sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix))]
    allowed = {"usr", "bin", "lib", "lib64", "lib32", "sbin", "proc", "dev", "tmp"} | {p.parts[1] for p in roots}
    lines = [line for line in reply.splitlines() if not line.startswith("```")]
    listed, in_tmp = eval(lines[0]), eval(lines[1])  # noqa: S307 - lists printed by the sandboxed code
    workdir, under_tmp = lines[2].split()
    assert set(listed) <= allowed, listed
    # the private /tmp holds the working directory and, where the venv lives under the host's /tmp, its path
    assert under_tmp == "True" and set(in_tmp) <= {workdir} | {p.parts[2] for p in roots if p.parts[1] == "tmp"}
    assert workdir in in_tmp and len(in_tmp) < len(os.listdir("/tmp"))  # the host's /tmp holds more
    assert lines[3] == "False False"


def _alive_with(marker: str) -> list[int]:
    """Host PIDs of live processes whose command line holds ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_process_started_in_a_new_session_is_gone_after_the_run(run):
    marker = f"600.{uuid.uuid4().int % 10**9:09d}"  # sleep's argument: a unique command line
    code = textwrap.dedent(f"""\
        import _posixsubprocess, os
        pid = _posixsubprocess.fork_exec([b'/bin/sleep', b'{marker}'], [b'/bin/sleep'], True, (), None, None,
                                         -1, -1, -1, -1, -1, -1, *os.pipe(), False, True, -1, None, None, None, -1,
                                         None, False)
        print('started', pid)""")
    reply = run(code)
    assert "started" in reply, reply
    deadline = time.monotonic() + 5  # the namespace's processes are killed asynchronously
    while _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _alive_with(marker) == []


def test_a_fork_bomb_hits_the_process_cap(run):
    reply = run("import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in reply or "Resource temporarily unavailable" in reply, reply[-500:]


STAND_IN = """
import os, sys
from arlopti.tasks.env.math_tool import MathPythonTool
from arlopti.tasks.env.python_tool import PythonLimits
class Tool(MathPythonTool):
    limits = PythonLimits(cpu_s=2, wall_s=5)
env = Tool()
env.reset()
print(repr(env.python(sys.argv[1])))
print("trainer alive", flush=True)
"""


def _stand_in_trainer(code: str) -> subprocess.CompletedProcess:
    """A process standing in for the trainer, holding a secret in its environment, that runs ``code``."""
    env = {**os.environ, "ARLOPTI_TRAINER_TOKEN": SECRET}
    return subprocess.run([sys.executable, "-c", STAND_IN, code], env=env, capture_output=True, text=True,
                          timeout=90)


def test_the_trainers_environment_is_not_readable():
    done = _stand_in_trainer("import os\nfor pid in (os.getppid(), 1):\n    try:\n"
                             "        print(open(f'/proc/{pid}/environ').read())\n"
                             "    except OSError as err:\n        print(err)")
    assert done.returncode == 0 and "trainer alive" in done.stdout, done.stderr
    assert SECRET not in done.stdout and "ARLOPTI_TRAINER_TOKEN" not in done.stdout


def test_the_trainer_survives_a_kill_of_the_codes_parent():
    done = _stand_in_trainer("import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), "
                             "signal.SIGKILL)\nprint('sent')")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "trainer alive" in done.stdout
