"""The platform facts of a job's interpreter, detected in that interpreter (`env --python`).

`kerneldctl env` chooses each kernel's variant for a platform. Its own interpreter's is the
wrong one on a system install: /opt/kerneld has no torch, the job that reads LOCAL_KERNELS has.
So the facts are detected where the job runs: the job's `python` runs this kerneldctl's own
`kerneld_client.platform` (the code the client loads with, so the facts, their versions cut
the same way, are the ones the client would send the daemon). Only that package is put on the
job's path, through a folder holding one link to it: the job's own packages (torch first) are
the ones it imports, and nothing of /opt/kerneld's site-packages shadows them. The probe needs
only the standard library and, if the job has it, torch. It detects (`detect_raw`), so a
platform pinned for kerneldctl itself (`KERNELD_PLATFORM_JSON`) does not answer for the job.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import kerneld_client
from kerneld.ctl.common import CtlError

if TYPE_CHECKING:
    from kerneld_client.variants import PlatformFacts

#: Detecting imports torch, and may initialise CUDA to read the device's capability.
PROBE_TIMEOUT_S = 120.0

#: Run as `python -c PROBE FOLDER`; prints one JSON object on its last line of output.
_PROBE = """\
import json, sys
if sys.version_info < (3, 10):
    print(json.dumps({"error": "it is Python %d.%d; kerneld's client needs 3.10 or later"
                      % sys.version_info[:2]}))
    raise SystemExit(0)
sys.path.insert(0, sys.argv[1])
from kerneld_client.platform import detect_raw
print(json.dumps({"facts": detect_raw()}))
"""


def facts_of(python: str, timeout: float = PROBE_TIMEOUT_S) -> PlatformFacts:
    """The platform facts `python` (a path, or a name on $PATH) detects for itself; CtlError
    (exit 1) naming the interpreter and what went wrong when it cannot tell."""
    from kerneld_client.variants.facts import PlatformFacts

    package = Path(kerneld_client.__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="kerneldctl-probe-") as folder:
        (Path(folder) / "kerneld_client").symlink_to(package, target_is_directory=True)
        try:
            ran = subprocess.run(
                [python, "-c", _PROBE, folder],
                capture_output=True,
                check=False,  # its exit status is read below, with its output
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )
        except OSError as exc:
            raise CtlError(
                f"cannot run --python {python}: {exc.strerror or exc}",
                hint="pass the job's interpreter, e.g. --python /path/to/venv/bin/python",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise CtlError(
                f"--python {python} did not report its platform within {timeout:.0f} s",
                hint="check that the interpreter starts and imports torch; or pass --variant NAME",
            ) from exc
    lines = [line for line in ran.stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if ran.returncode != 0 or not isinstance(doc, dict):
        tail = (ran.stderr.strip().splitlines() or ["no output"])[-1]
        raise CtlError(
            f"--python {python} could not detect its platform (exit {ran.returncode}): {tail}",
            hint="pass the job's interpreter, or --variant NAME",
        )
    if "error" in doc:
        raise CtlError(f"--python {python}: {doc['error']}")
    try:
        return PlatformFacts.from_dict(doc["facts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"--python {python} reported facts that do not parse: {exc}") from exc
