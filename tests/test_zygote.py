"""The zygote (tests/support/zygote.py) runs a job as a fresh `python -c` would: the same output,
exit status, environment, working directory and `__main__`, and nothing of the suite's loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import zygote

JOBS = {
    "prints": "import torch, json, os, sys\n"
    "print(json.dumps({'argv': sys.argv, 'name': __name__, 'cwd': os.getcwd(),\n"
    "    'var': os.environ.get('ZYGOTE_TEST'), 'path0': sys.path[0],\n"
    "    'ours': sorted(m for m in sys.modules\n"
    "                   if m.split('.')[0] in ('kerneld', 'kerneld_client', 'tests')),\n"
    "    'bytecode': sys.dont_write_bytecode}))\n"
    "print('to stderr', file=sys.stderr)\n",
    "exits 3": "import torch, sys\nprint('before', end='')\nsys.exit(3)\n",
    "exits with a message": "import torch, sys\nsys.exit('a message')\n",
    "raises": "import torch\n\ndef f():\n    raise ValueError('boom')\n\nf()\n",
    "a thread and atexit": "import torch, atexit, threading, time\n"
    "atexit.register(lambda: print('atexit'))\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
    "print('main')\n",
    "killed": "import torch, os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
}


def _fresh(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _forms(code: str, tmp_path: Path) -> dict[str, list[str]]:
    """The job as `python -c CODE ARG`, `python -m MODULE ARG` and `python PATH ARG`."""
    (tmp_path / "zygote_job.py").write_text(code, encoding="utf-8")
    return {
        "-c": ["-c", code, "an-arg"],
        "-m": ["-m", "zygote_job", "an-arg"],
        "path": [str(tmp_path / "zygote_job.py"), "an-arg"],
    }


#: Jobs whose output depends on how the script was named (argv, `__main__`, sys.path[0], the
#: traceback's frames, SystemExit through runpy): every form. The others end the same way
#: whatever the form (the child's exit path is one), so `-c` shows it.
EVERY_FORM = ("prints", "raises", "exits 3")
CASES = [(job, form) for job in sorted(JOBS) for form in ("-c", "-m", "path")]


@pytest.mark.parametrize(
    ("job", "form"), [(j, f) for j, f in CASES if f == "-c" or j in EVERY_FORM]
)
def test_a_job_in_the_zygote_is_a_fresh_process(
    job: str, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # where `-m` finds the job's module
    argv = _forms(JOBS[job], tmp_path)[form]
    env = dict(os.environ, ZYGOTE_TEST=job, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    assert zygote.forkable(argv, env, tmp_path)
    forked = zygote.run_python(argv, env=env, cwd=tmp_path, timeout=60)
    fresh = _fresh(argv, env, tmp_path)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    if form == "-c":  # the same traceback; by `-m` or a path, runpy's frames may differ
        assert forked.stderr == fresh.stderr
    else:
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]


def test_a_hung_job_is_killed_at_its_timeout_and_the_zygote_serves_on(tmp_path: Path) -> None:
    env = dict(os.environ)
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run_python(
            ["-c", "import torch, time\ntime.sleep(60)\n"], env=env, cwd=tmp_path, timeout=1
        )
    done = zygote.run_python(
        ["-c", "import torch\nprint('next')\n"], env=env, cwd=tmp_path, timeout=60
    )
    assert done.stdout == "next\n"


def test_another_start_up_environment_gets_another_zygote(tmp_path: Path) -> None:
    code = ["-c", "import torch, sys\nprint(sys.path[1])\n"]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    other = dict(env, PYTHONPATH=str(tmp_path))
    assert zygote.run_python(code, env=other, cwd=tmp_path, timeout=60).stdout == f"{tmp_path}\n"
    assert zygote.run_python(code, env=env, cwd=tmp_path, timeout=60).stdout != f"{tmp_path}\n"


def test_the_hook_is_part_of_the_start_up_environment(tmp_path: Path) -> None:
    """kerneld_client_hook.pth reads KERNELD_HOOK_KERNELS while the interpreter starts and, when
    it is on, puts the finder that waits for `import kernels` on sys.meta_path: jobs with the
    hook on and off, one after the other, each see the finders a fresh interpreter has."""
    code = ["-c", "import torch, sys\nprint(sorted(type(f).__name__ for f in sys.meta_path))\n"]
    seen = []
    for value in ("1", "0", "1"):
        env = {**os.environ, "KERNELD_HOOK_KERNELS": value}
        assert zygote.forkable(code, env, tmp_path)
        forked = zygote.run_python(code, env=env, cwd=tmp_path, timeout=60)
        fresh = subprocess.run(
            [sys.executable, *code], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert forked.returncode == fresh.returncode == 0
        assert forked.stdout == fresh.stdout, (forked.stdout, fresh.stdout)
        seen.append("KernelsFinder" in forked.stdout)
    assert seen == [True, False, True]


def test_a_late_torch_and_interpreter_options_start_fresh(tmp_path: Path) -> None:
    """A script that runs code before importing torch may measure or change that import, and
    options change how the interpreter runs: both fresh."""
    env = dict(os.environ)
    assert not zygote.forkable(["-c", "import time\nT0 = time.time()\nimport torch"], env, tmp_path)
    assert not zygote.forkable(["-u", "-c", "import torch"], env, tmp_path)


@pytest.mark.parametrize(
    ("code", "first"),
    [
        ("import torch\n", True),
        ("import json, sys\nfrom torch import nn\n", True),
        ("import os\nimport torch.nn.functional as F\n", True),
        ("import kerneld_client\nimport torch\n", False),  # the client before torch
        ("x = 1\nimport torch\n", False),  # code before torch
        ("import json\n", False),  # no torch
        ("def broken(:\n", False),
    ],
)
def test_only_a_script_that_imports_torch_first_is_forked(code: str, first: bool) -> None:
    assert zygote.torch_first(code) is first
