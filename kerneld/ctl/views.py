"""Progress output for long commands (prefetch, mirror export/import).

On a terminal: a live rich progress display, one bar per variant being downloaded (files and
bytes), with a line per finished or failed kernel above it. Not on a terminal (logs, CI): one
quiet line per kernel step, no bars and no carriage returns. With --json: nothing at all (the
final document says everything).
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import Ctx, human_bytes
from kerneld.pipeline.fetch_progress import FetchProgress


def pb_untrusted() -> int:
    """ErrorCode UNTRUSTED_PUBLISHER (the proto module is imported only when needed)."""
    from kerneld_client.proto import kerneld_pb2

    return int(kerneld_pb2.UNTRUSTED_PUBLISHER)


def progress_from_proto(event: Any) -> FetchProgress:
    """A `kerneld.v1.PrefetchEvent` of the daemon's stream as the event a local prefetch emits."""
    from kerneld.ctl.rpc import detail_message

    name = event.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[event.kind].name
    error = ""
    if event.HasField("error") and (event.error.message or event.error.code):
        error = detail_message(event.error)
        if event.error.code == pb_untrusted() and event.error.hint:
            error += f" ({event.error.hint})"  # how to allow it: the admin's own fix
    return FetchProgress(
        name.lower().replace("_", "-"),
        event.repo_id,
        event.commit,
        event.variant,
        path=event.path,
        bytes_done=event.bytes_done,
        bytes_total=event.bytes_total,
        files_done=event.files_done,
        files_total=event.files_total,
        tree_digest=event.tree_digest,
        already_present=event.already_present,
        error=error,
        kernels_ok=event.kernels_ok,
        kernels_failed=event.kernels_failed,
    )


def _short(commit: str) -> str:
    return commit[:7] if commit else "?"


class _LiveView:
    """A live rich display on a terminal, one plain line per event elsewhere, nothing at all
    with --json: what every progress view shares."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self._progress: Any = None

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _line(self, text: str) -> None:
        if self.ctx.json:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            self.ctx.say(text)


class PrefetchView(_LiveView):
    """Renders prefetch steps and collects the per-kernel results for the summary/JSON."""

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.kernels: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.finished: FetchProgress | None = None
        self._tasks: dict[tuple[str, str, str], Any] = {}
        if ctx.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            console = Console(file=ctx.out, force_terminal=True, highlight=False)
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[files]}"),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )

    def __enter__(self) -> PrefetchView:
        if self._progress is not None:
            self._progress.start()
        return self

    def _kernel(self, step: FetchProgress) -> dict[str, Any]:
        key = step.repo_id
        if key not in self.kernels:
            self.kernels[key] = {
                "repo_id": step.repo_id,
                "commit": step.commit,
                "status": "running",
                "variants": [],
                "error": "",
            }
            self.order.append(key)
        k = self.kernels[key]
        if step.commit:
            k["commit"] = step.commit
        return k

    def handle(self, step: FetchProgress) -> None:
        if step.kind == "finished":
            self.finished = step
            return
        k = self._kernel(step)
        label = f"{step.repo_id}@{_short(k['commit'])}" if k["commit"] else step.repo_id
        if step.kind == "kernel-started":
            n = step.files_total
            self._line(f"prefetching {label} ({n} variant{'s' if n != 1 else ''})")
        elif step.kind in ("file-progress", "file-done"):
            self._bar(step, label)
        elif step.kind == "variant-done":
            k["variants"].append(
                {
                    "variant": step.variant,
                    "tree_digest": step.tree_digest,
                    "path": step.path,
                    "already_present": step.already_present,
                }
            )
            task = self._tasks.get((step.repo_id, step.commit, step.variant))
            if task is not None and self._progress is not None:
                t = self._progress.tasks[task]
                self._progress.update(task, completed=t.total or t.completed)
            how = "already in the store" if step.already_present else "fetched"
            self._line(f"  {step.variant}: {how}")
        elif step.kind == "kernel-done":
            k["status"] = "ok"
            self._line(f"ok {label}")
        elif step.kind == "kernel-failed":
            k["status"] = "failed"
            k["error"] = step.error or "failed"
            what = f" [{step.variant}]" if step.variant else ""
            self._line(f"FAILED {label}{what}: {k['error']}")

    def _bar(self, step: FetchProgress, label: str) -> None:
        if self._progress is None:
            return
        key = (step.repo_id, step.commit, step.variant)
        files = f"{step.files_done}/{step.files_total} files" if step.files_total else ""
        task = self._tasks.get(key)
        if task is None:
            task = self._progress.add_task(
                f"{label} {step.variant}", total=step.bytes_total or None, files=files
            )
            self._tasks[key] = task
        self._progress.update(
            task,
            completed=step.bytes_done,
            total=step.bytes_total or None,
            files=files,
        )

    def results(self) -> list[dict[str, Any]]:
        return [self.kernels[k] for k in self.order]

    @property
    def failed(self) -> int:
        return sum(1 for k in self.kernels.values() if k["status"] == "failed")

    def summary_line(self) -> str:
        ok = sum(1 for k in self.kernels.values() if k["status"] == "ok")
        return f"{ok} kernel(s) ok, {self.failed} failed"


class MirrorView(_LiveView):
    """Renders mirror export/import progress (events shaped like MirrorProgress)."""

    def __init__(self, ctx: Ctx, verb: str) -> None:
        super().__init__(ctx)
        self.verb = verb
        self.refused: list[str] = []
        self._task: Any = None
        if ctx.tty:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            console = Console(file=ctx.out, force_terminal=True, highlight=False)
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[blobs]} blobs"),
                DownloadColumn(),
                console=console,
            )

    def __enter__(self) -> MirrorView:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task(self.verb, total=None, blobs=0)
        return self

    def handle(self, kind: str, ev: Any) -> None:
        where = f"{ev.repo_id}@{_short(ev.commit)}" if ev.repo_id else ""
        if kind == "blob":
            if self._progress is not None:
                self._progress.update(
                    self._task,
                    completed=ev.bytes_done,
                    total=ev.bytes_total or None,
                    blobs=ev.blobs,
                )
        elif kind == "manifest":
            self._line(
                f"{self.verb} {where} [{ev.detail}]" if ev.detail else f"{self.verb} {where}"
            )
        elif kind == "verdict":
            self._line(
                f"publisher of {ev.repo_id}: trusted at the exporting site ({ev.detail}); "
                "recorded for this host's [trust]"
                if ev.detail
                else f"publisher of {ev.repo_id}: the bundle carries no verdict; this host's "
                "[trust] decides (e.g. [trust] allow)"
            )
        elif kind == "signature-ok":
            pass  # one line per manifest is enough; the report names the keys
        elif kind == "refused":
            self.refused.append(f"{where}: {ev.detail}" if where else ev.detail)
            self._line(f"REFUSED {where}: {ev.detail}" if where else f"REFUSED: {ev.detail}")
        elif kind == "finished":
            if self._progress is not None and self._task is not None:
                self._progress.update(
                    self._task, completed=ev.bytes_done, total=max(ev.bytes_total, 1)
                )
            self._line(f"{ev.detail} ({human_bytes(ev.bytes_done)} copied)" if ev.detail else "")
