"""The daemon side of the chaos run: a supervisor, a killer and the admin churn.

`Supervisor` plays systemd with `Restart=always`: it starts the real `kerneld`
(`tests.support.daemon.DaemonProcess`), restarts it whenever it is gone, and tells apart the
exits it caused (SIGKILL/SIGTERM from the killer) from any other exit, which is a crash.
`Killer` kills the daemon every so often, mostly with SIGKILL (no cleanup at all), sometimes
with SIGTERM (the drain path must end within its timeout), and leaves it down for a moment so
clients see a dead socket. `AdminChurn` runs the real `kerneldctl` (prefetch, GC, pin/unpin,
deny/allow) and records when each pin and deny was in force, so `checks` can prove that GC
never evicted a pinned tree and that no load started under a deny got the kernel.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.catalog import Catalog, Choice
from tests.support.ctl import KERNELDCTL, ctl_env
from tests.support.daemon import DaemonFailed, DaemonProcess

READY_TIMEOUT_S = 60.0


@dataclass
class Restart:
    at: float
    how: str
    """sigkill, sigterm or crash (an exit nobody asked for)."""
    exit_code: int | None
    ready_s: float | None
    """Seconds from start to ready; None when it never became ready."""
    detail: str = ""


class Supervisor:
    """Keeps one daemon running; every start after the first is a restart."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.lock = threading.RLock()
        self.restarts: list[Restart] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="chaos-monitor", daemon=True)

    def start(self) -> None:
        self.daemon.start()
        self._monitor.start()

    def _tail(self, n: int = 3000) -> str:
        return self.daemon.log_path.read_text(encoding="utf-8", errors="replace")[-n:]

    def _start_again(self, how: str, exit_code: int | None, detail: str = "") -> None:
        """Start the daemon (caller holds the lock) and record the restart."""
        t0 = time.monotonic()
        ready: float | None = None
        try:
            self.daemon.spawn()
            self.daemon.wait_ready(READY_TIMEOUT_S)
            ready = time.monotonic() - t0
        except DaemonFailed as exc:
            self.problems.append(f"restart after {how} failed: {str(exc)[-2000:]}")
        self.restarts.append(Restart(time.time(), how, exit_code, ready, detail))

    def kill(self, sig: int, down_s: float) -> None:
        """Kill the daemon with `sig`, leave it down `down_s`, start it again."""
        with self.lock:
            if not self.daemon.running():
                return
            how = "sigkill" if sig == signal.SIGKILL else "sigterm"
            try:
                code = self.daemon.stop(sig, timeout=30)
            except DaemonFailed as exc:  # did not exit in time: killed by stop()
                self.problems.append(
                    f"{how}: the daemon did not exit within 30 s: {str(exc)[-1500:]}"
                )
                code = None
            if sig == signal.SIGTERM and code not in (0, None):
                self.problems.append(f"sigterm: exit code {code}:\n{self._tail()}")
            time.sleep(down_s)
            self._start_again(how, code)

    def ensure_running(self) -> None:
        with self.lock:
            if not self.daemon.running():
                self._crashed()

    def _crashed(self) -> None:
        assert self.daemon.proc is not None
        code = self.daemon.proc.poll()
        tail = self._tail()
        self.problems.append(f"the daemon exited on its own (code {code}):\n{tail}")
        self._start_again("crash", code, tail[-500:])

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self.lock:
                if self.daemon.proc is not None and not self.daemon.running():
                    self._crashed()

    def stop(self) -> int | None:
        """Stop watching, then stop the daemon with SIGTERM; its exit code."""
        self._stop.set()
        self._monitor.join(timeout=10)
        with self.lock:
            if not self.daemon.running():
                return None
            try:
                return self.daemon.stop(signal.SIGTERM, timeout=30)
            except DaemonFailed as exc:
                self.problems.append(f"final SIGTERM: did not exit within 30 s: {str(exc)[-1500:]}")
                return None


class Killer(threading.Thread):
    """Kills the daemon every `every_s` (jittered); one kill in `term_share` is a SIGTERM."""

    def __init__(
        self, sup: Supervisor, *, every_s: float, seed: int, term_share: float = 0.2
    ) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.sup = sup
        self.every_s = every_s
        self.term_share = term_share
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s * self.rng.uniform(0.6, 1.4)):
            sig = signal.SIGTERM if self.rng.random() < self.term_share else signal.SIGKILL
            self.sup.kill(sig, down_s=self.rng.uniform(0.0, 2.0))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=120)


@dataclass
class AdminOp:
    command: str
    args: list[str]
    t_start: float
    t_end: float
    rc: int
    doc: Any = None
    stderr: str = ""


@dataclass
class Window:
    """A pin or deny in force from `start` (its command returned) to `end` (its undo began)."""

    repo: str
    revision: str
    """A commit, or `*` (the whole repo)."""
    start: float
    end: float | None = None


@dataclass
class Undo:
    """An unpin or allow to run at `due`."""

    due: float
    command: str
    spec: str
    window: Window | None
    attempts: int = 0


@dataclass
class AdminLog:
    ops: list[AdminOp] = field(default_factory=list)
    pins: list[Window] = field(default_factory=list)
    denies: list[Window] = field(default_factory=list)


class AdminChurn(threading.Thread):
    """Runs kerneldctl against the daemon's admin socket, every `every_s` (jittered)."""

    def __init__(
        self,
        sup: Supervisor,
        cat: Catalog,
        home: Path,
        *,
        every_s: float,
        gc_every_s: float,
        seed: int,
    ) -> None:
        super().__init__(name="chaos-admin", daemon=True)
        self.sup = sup
        self.cat = cat
        self.home = home
        self.every_s = every_s
        self.gc_every_s = gc_every_s
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.log = AdminLog()
        self.real = [c for c in cat.choices if c.kind != "absent"]
        self._pending: list[Undo] = []
        self.problems: list[str] = []

    def ctl(self, *args: str, timeout: float = 120.0) -> AdminOp:
        """Run `kerneldctl ARGS --json` against the daemon; never raises."""
        cmd = [
            KERNELDCTL,
            *args,
            "--json",
            "--admin-socket",
            str(self.sup.daemon.admin_socket),
            "--timeout",
            "30",
        ]
        t0 = time.time()
        try:
            proc = subprocess.run(
                cmd,
                check=False,
                capture_output=True,
                text=True,
                env=ctl_env(self.home),
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = -1, "", f"kerneldctl hung for {timeout}s: {exc}"
        doc: Any = None
        if out.strip():
            try:
                doc = json.loads(out)
            except ValueError:
                doc = None
        op = AdminOp(args[0], list(args[1:]), t0, time.time(), rc, doc, err[-1000:])
        self.log.ops.append(op)
        return op

    def _spec(self, choice: Choice) -> str:
        return choice.label

    def _prefetch(self) -> None:
        choice = self.rng.choice(self.real)
        variants = self.rng.choice((["--variants", "auto"], ["--variants", "all"]))
        self.ctl("prefetch", self._spec(choice), *variants)

    def _pin(self) -> None:
        choice = self.rng.choice(self.real)
        op = self.ctl("pin", self._spec(choice))
        window = None
        if op.rc == 0 and isinstance(op.doc, dict) and op.doc.get("commit"):
            window = Window(choice.repo, str(op.doc["commit"]), op.t_end)
            self.log.pins.append(window)
        # Unpin later whatever happened: the pin may have landed before a kill cut the answer.
        due = time.time() + self.rng.uniform(4, 12)
        self._pending.append(Undo(due, "unpin", self._spec(choice), window))

    def _deny(self) -> None:
        choice = self.rng.choice(self.real)
        whole = self.rng.random() < 0.5
        target = choice.repo if whole or choice.commit is None else f"{choice.repo}@{choice.commit}"
        revision = "*" if whole or choice.commit is None else choice.commit
        window = None
        op = self.ctl("deny", target, "--reason", "chaos")
        if op.rc == 0:
            window = Window(choice.repo, revision, op.t_end)
            self.log.denies.append(window)
        self._pending.append(Undo(time.time() + self.rng.uniform(2, 6), "allow", target, window))

    def _undo_due(self, *, everything: bool = False) -> bool:
        """Run the unpins/allows that are due; True when none is left.

        A failure because the daemon is down or starting is retried. Otherwise an undo that
        fails is dropped when its pin/deny never took (the daemon was down, the upstream failed),
        and retried, then reported, when it did take.
        """
        left = []
        for undo in self._pending:
            if not everything and undo.due > time.time():
                left.append(undo)
                continue
            if undo.window is not None and undo.window.end is None:
                undo.window.end = time.time()
            if undo.command == "allow" and undo.window is not None:
                # Two denies of the same repo (or repo@commit) are one row in the store: the
                # first allow lifts both, so every window of that row ends here (a load served
                # between the two allows is not one served under a deny).
                w = undo.window
                for other in self.log.denies:
                    same = (other.repo, other.revision) == (w.repo, w.revision)
                    if same and other.end is None:
                        other.end = undo.window.end
            op = self.ctl(undo.command, undo.spec)
            if op.rc == 0:
                continue
            undo.attempts += 1
            transient = op.rc in (-1, 3) or "starting" in op.stderr or "not ready" in op.stderr
            if transient or (undo.window is not None and undo.attempts < 5):
                undo.due = time.time() + 1.0
                left.append(undo)
            elif undo.window is not None:
                self.problems.append(
                    f"kerneldctl {undo.command} {undo.spec} failed {undo.attempts} times "
                    f"after it took effect: rc {op.rc}: {op.stderr[-500:]}"
                )
        self._pending = left
        return not left

    def run(self) -> None:
        next_gc = time.time() + self.gc_every_s
        while not self.stop_event.wait(self.every_s * self.rng.uniform(0.5, 1.5)):
            self._undo_due()
            if time.time() >= next_gc:
                self.ctl("gc")
                next_gc = time.time() + self.gc_every_s * self.rng.uniform(0.5, 1.5)
                continue
            action = self.rng.choices(
                (self._prefetch, self._pin, self._deny), weights=(4.0, 2.5, 1.0)
            )[0]
            action()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=300)

    def undo_all(self, timeout_s: float = 120.0) -> bool:
        """Lift every deny and pin still in force (the daemon must be up); True when done."""
        deadline = time.monotonic() + timeout_s
        while not self._undo_due(everything=True):
            if time.monotonic() > deadline:
                return False
            self.sup.ensure_running()
            time.sleep(1.0)
        return True
