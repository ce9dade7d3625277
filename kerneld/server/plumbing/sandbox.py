"""What kerneld.service's sandbox lets the daemon write, so a store path it makes read-only is
named as the cause (and the fix given) instead of being taken for a failing disk.

Two questions, asked from two places:
- `kerneld --check-config`, run by the admin outside the sandbox: does the installed unit
  (with its drop-ins, as `systemctl show` reports them) leave `[store] path` writable? Under
  ProtectSystem=strict only the unit's StateDirectory=, CacheDirectory=, RuntimeDirectory=,
  the private /tmp and its ReadWritePaths= are; ProtectHome= hides /home, /root and /run/user.
- the daemon, when opening the store failed with EROFS: is the mount the store is on read-only
  only for this process (a read-only bind of a writable file system: the sandbox), or is the
  file system itself read-only (a disk error remounts it so)? /proc/self/mountinfo tells.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kerneld.config.environment import Environment

__all__ = [
    "DROP_IN",
    "UNIT",
    "Sandbox",
    "dropin_fix",
    "installed_sandbox",
    "readonly_by_sandbox",
]

UNIT = "kerneld.service"
#: Where the shipped drop-in (systemd/kerneld-store.conf) is installed.
DROP_IN = Path("/etc/systemd/system/kerneld.service.d/store.conf")
_PROPERTIES = (
    "LoadState",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "ReadWritePaths",
    "StateDirectory",
    "CacheDirectory",
    "RuntimeDirectory",
    "LogsDirectory",
)
#: Where each *Directory= property's relative names live for a system service.
_DIRECTORY_ROOTS = {
    "StateDirectory": Path("/var/lib"),
    "CacheDirectory": Path("/var/cache"),
    "RuntimeDirectory": Path("/run"),
    "LogsDirectory": Path("/var/log"),
}
_HOME = (Path("/home"), Path("/root"), Path("/run/user"))
_SYSTEM_FULL = (Path("/usr"), Path("/boot"), Path("/efi"), Path("/etc"))


def dropin_fix(path: Path) -> str:
    """The fix for a store directory the unit makes read-only."""
    return (
        f"allow it in a drop-in: `systemctl edit kerneld` and add `[Service]` "
        f"`ReadWritePaths={path}` (or install systemd/kerneld-store.conf as {DROP_IN}, "
        "edited to that path), then `systemctl daemon-reload` and `systemctl restart kerneld` "
        "(docs/operations.md, Moving the store to another disk)"
    )


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


@dataclass(frozen=True)
class Sandbox:
    """The file-system part of a unit's sandbox, as `systemctl show` reports it."""

    protect_system: str
    protect_home: str
    private_tmp: bool
    writable: tuple[Path, ...]

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> Sandbox:
        writable: list[Path] = []
        for word in props.get("ReadWritePaths", "").split():
            writable.append(Path(word.lstrip("-+")))
        for key, root in _DIRECTORY_ROOTS.items():
            writable += [root / name for name in props.get(key, "").split()]
        return cls(
            protect_system=props.get("ProtectSystem", "no"),
            protect_home=props.get("ProtectHome", "no"),
            private_tmp=props.get("PrivateTmp", "no") == "yes",
            writable=tuple(writable),
        )

    def refusal(self, path: Path) -> str | None:
        """Why the unit's daemon could not write `path` (None: it can)."""
        path = Path(os.path.abspath(path))
        if self.protect_home not in ("no", "") and _under(path, _HOME):
            return (
                f"{path} is under a home directory, which the unit hides from the daemon "
                f"(ProtectHome={self.protect_home}): put the store on another path"
            )
        if _under(path, self.writable):
            return None
        if self.private_tmp and _under(path, (Path("/tmp"), Path("/var/tmp"))):
            return (
                f"{path} is in the unit's private /tmp (PrivateTmp=yes): it is emptied at every "
                "start; put the store on another path"
            )
        if self.protect_system == "strict" or (
            self.protect_system in ("yes", "full")
            and _under(path, _SYSTEM_FULL[: 3 if self.protect_system == "yes" else 4])
        ):
            return (
                f"kerneld.service's sandbox (ProtectSystem={self.protect_system}) makes {path} "
                f"read-only for the daemon: {dropin_fix(path)}"
            )
        return None


def installed_sandbox() -> Sandbox | None:
    """The installed unit's sandbox, with its drop-ins; None when there is no systemd here or
    the unit is not installed (nothing to check)."""
    if shutil.which("systemctl") is None:
        return None
    try:
        done = subprocess.run(
            ["systemctl", "show", UNIT, *(f"--property={p}" for p in _PROPERTIES)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded":
        return None
    return Sandbox.from_properties(props)


def _mount_for(path: Path, mountinfo: str) -> tuple[Path, set[str], set[str]] | None:
    """(mount point, per-mount options, file-system options) of the mount holding `path`."""
    best: tuple[Path, set[str], set[str]] | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        sep = fields.index("-")
        point = Path(fields[4].replace("\\040", " "))
        if not (path == point or point in path.parents):
            continue
        if best is None or len(point.parts) >= len(best[0].parts):
            best = (point, set(fields[5].split(",")), set(fields[sep + 3].split(",")))
    return best


def readonly_by_sandbox(path: Path, mountinfo: str | None = None) -> str | None:
    """Why `path` is read-only when the sandbox (not the file system) makes it so; None when
    the file system itself is read-only, or `path` is writable, or it cannot be told."""
    target = Path(os.path.abspath(path))
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
        target = target.resolve()
    except OSError:
        return None
    found = _mount_for(target, text)
    if found is None:
        return None
    point, mount_opts, fs_opts = found
    if "ro" not in mount_opts or "ro" in fs_opts:
        return None
    under_systemd = Environment.read().invocation_id is not None
    who = "kerneld.service's sandbox (ProtectSystem=strict)" if under_systemd else "a bind mount"
    return (
        f"the file system of {path} is writable, but {who} mounts {point} read-only for the "
        f"daemon: {dropin_fix(Path(path)) if under_systemd else 'mount it read-write'}"
    )
