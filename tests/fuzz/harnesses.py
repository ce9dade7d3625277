"""The fuzz harnesses that run real components on fuzzed input, each inside a `Sandbox`: a store
publishing fuzzed variants, mirror bundle imports, the Hub client against crafted Hub answers and
the daemon's Resolve servicer.

They apply the invariants of `tests/fuzz/invariants.py` (typed errors, sane results, no write
outside the target) to what these components do with the input; the hypothesis tests
(`tests/fuzz/test_*.py`) and the atheris targets (`fuzz/*.py`) share them.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.fuzz.invariants import (
    COMMIT,
    HEX40,
    HEX64,
    OUTSIDE,
    REPO,
    InvariantViolation,
    Sandbox,
    default_recursion_limit,
    expect,
    inside,
    typed,
)

# ---- metadata.json through the store (kerneld.store) -------------------------------------------


class StoreHarness:
    """A real store in a sandbox; publishes fuzzed variants through the store's full path."""

    def __init__(self, root: Path) -> None:
        from kerneld.store import Store

        self.sandbox = Sandbox(root)
        self.store = Store.open(self.sandbox.target, min_free_bytes=0, auto_gc=False)
        self._empty_mirror = root / "empty-mirror"
        self._empty_mirror.mkdir(exist_ok=True)

    def close(self) -> None:
        self.store.close()

    def publish(self, files: Mapping[str, bytes], variant: str = "torch-universal") -> None:
        """Ingest `files` and publish them as one variant: typed StoreError or a sane tree,
        whose metadata the daemon then reads (metadata_to_proto, kernel-depends)."""
        from kerneld.mirror.upstream import MirrorDirUpstream
        from kerneld.pipeline.resolve import KernelSpec, Resolver
        from kerneld.server.fronts.rpc.convert import metadata_to_proto
        from kerneld.store import StoreError, TreeFile

        files = {self.sandbox.hostile(p): d for p, d in files.items()}
        seed = hashlib.sha1(usedforsecurity=False)
        for path, data in sorted(files.items()):
            seed.update(path.encode("utf-8", "surrogatepass") + b"\0" + data)
        commit = seed.hexdigest()
        with self.sandbox.guard():
            tree_files = []
            for path, data in files.items():
                info = self.store.blobs.ingest(
                    data, size=len(data), sha256=hashlib.sha256(data).hexdigest()
                )
                tree_files.append(TreeFile(path=path, sha256=info.sha256, size=len(data)))
            out = typed(
                lambda: self.store.trees.publish_tree(REPO, commit, variant, tree_files),
                (StoreError,),
                "publish_tree",
            )
            self.sandbox.check_target_contained()
            tree = out.value
            if tree is None:
                return
            expect(inside(tree.path, self.sandbox.target), f"tree {tree.path} outside the store")
            # The store's own maintenance (GC's remove_tree, verify) walks trees recursively, in a
            # daemon thread with Python's default recursion limit.
            with default_recursion_limit():
                typed(lambda: list(os.walk(tree.path)), (), "walking the published tree")
            for path, data in files.items():
                real = tree.path / path
                expect(inside(real, tree.path), f"{path!r} left its tree")
                expect(real.read_bytes() == data, f"{path!r} differs from what was published")
                expect(not os.access(real, os.W_OK) or os.geteuid() == 0, f"{path!r} writable")
            typed(lambda: metadata_to_proto(tree.path / "metadata.json"), (), "metadata_to_proto")
            hit = self.store.catalog.lookup(REPO, commit, variant)
            expect(hit is not None and hit.path == tree.path, "published tree not found by lookup")
            assert hit is not None
            resolver = Resolver(self.store, [MirrorDirUpstream(self._empty_mirror)])
            deps = typed(
                lambda: resolver.dependencies_of(hit), (StoreError,), "dependencies_of"
            ).value
            expect(all(isinstance(d, KernelSpec) for d in deps or []), "bad dependency specs")


# ---- mirror bundles (kerneld.mirror.bundle + import_) -----------------------------------------


class BundleHarness:
    """Imports fuzzed bundles (tar bytes or directories) into a real store in a sandbox."""

    def __init__(self, root: Path) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from kerneld.store import Store

        self.sandbox = Sandbox(root)
        self.store = Store.open(self.sandbox.target, min_free_bytes=0, auto_gc=False)
        self.key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
        self.trusted = {"fuzz-key": self.key.public_key()}

    def close(self) -> None:
        self.store.close()

    def check_tar(self, data: bytes, *, check_sigs: bool = False) -> None:
        path = self.sandbox.inputs / "bundle.tar"
        path.write_bytes(data)
        self.check_path(path, check_sigs=check_sigs)

    def check_path(self, source: Path, *, check_sigs: bool = False) -> None:
        """`import_mirror`: MirrorImportRefused or a report; nothing outside the store changes
        (the bundle itself included); whatever was imported is in the store and intact."""
        from kerneld.mirror.import_ import MirrorImportRefused, import_mirror

        with self.sandbox.guard():
            out = typed(
                lambda: import_mirror(
                    self.store, source, self.trusted, no_check_sigs=not check_sigs
                ),
                (MirrorImportRefused,),
                "import_mirror",
            )
            self.sandbox.check_target_contained()
        report = out.value
        if report is None:
            return
        json.dumps(report.to_dict())
        for refused in report.refused:
            expect(refused.get("reason"), f"a refusal without a reason: {refused}")
        for kernel in report.imported:
            for v in kernel["variants"]:
                tree = Path(v["path"])
                expect(inside(tree, self.sandbox.target), f"imported tree {tree} outside the store")
                hit = self.store.catalog.lookup(kernel["repo_id"], kernel["commit"], v["variant"])
                expect(hit is not None and hit.path == tree, "imported variant not in the store")
                for file in tree.rglob("*"):
                    expect(not file.is_symlink(), f"symlink {file} in an imported tree")

    def sign(self, rel: str, data: bytes) -> bytes:
        """The detached signature file of a mirror document (to build valid signed seeds)."""
        from kerneld.mirror.keys import SigningKey, make_signature_file

        return make_signature_file(rel, data, [SigningKey("fuzz-key", self.key)])


# ---- Hub API responses (kerneld.upstream.hub) ---------------------------------------------------


class CraftedHub:
    """A Hub-compatible endpoint on 127.0.0.1 that answers with whatever the fuzzer crafted:
    tree listings (`trees[path]`), the revision answer, and file bytes (`files[path]`)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import unquote, urlsplit

        hub = self
        self.trees: dict[str, bytes] = {}
        self.files: dict[str, bytes] = {}
        self.revision = json.dumps({"id": REPO, "sha": COMMIT}).encode()
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle's algorithm and the
            # client's delayed ACK add 40 ms to every answer.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.requests += 1
                path = unquote(urlsplit(self.path).path)
                tree = f"/api/kernels/{REPO}/tree/{COMMIT}/"
                resolve = f"/kernels/{REPO}/resolve/{COMMIT}/"
                body: bytes | None = None
                if path.startswith(tree):
                    body = hub.trees.get(path[len(tree) :])
                elif path.startswith(f"/api/kernels/{REPO}/revision/"):
                    body = hub.revision
                elif path.startswith(resolve):
                    body = hub.files.get(path[len(resolve) :])
                if body is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def tree_entry(path: str, data: bytes, *, lfs: bool = False) -> dict[str, Any]:
    """A tree-listing entry as the Hub writes it (what huggingface_hub parses)."""
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    entry: dict[str, Any] = {"type": "file", "oid": blob, "size": len(data), "path": path}
    if lfs:
        entry["lfs"] = {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": 130,
        }
    return entry


class HubHarness:
    """HubUpstream (the real huggingface_hub client underneath) and a real fetch into a store,
    against crafted Hub answers."""

    def __init__(self, root: Path) -> None:
        from kerneld.store import Store

        self.sandbox = Sandbox(root)
        self.store = Store.open(self.sandbox.target, min_free_bytes=0, auto_gc=False)
        self.hub = CraftedHub()

    def close(self) -> None:
        self.hub.close()
        self.store.close()

    def check(
        self,
        variant: str,
        listing: bytes,
        files: Mapping[str, bytes],
        variants_listing: bytes | None = None,
    ) -> None:
        """list_variants / list_files: UpstreamError only and sane entries; a fetch of what
        they list: UpstreamError or StoreError only, nothing written outside the store."""
        from kerneld.pipeline.fetch import Fetcher
        from kerneld.store import InvalidInputError, StoreError
        from kerneld.upstream.errors import UpstreamError
        from kerneld.upstream.hub import HubUpstream
        from kerneld.upstream.retry import RetryPolicy

        hub, outside = self.hub, str(self.sandbox.outside).encode()
        listing = listing.replace(OUTSIDE.encode(), outside)
        variants_listing = variants_listing and variants_listing.replace(OUTSIDE.encode(), outside)
        files = {self.sandbox.hostile(p): d for p, d in files.items()}
        hub.trees = {f"build/{variant}": listing}
        if variants_listing is not None:
            hub.trees["build"] = variants_listing
        hub.files = {f"build/{variant}/{p}": d for p, d in files.items()}
        up = HubUpstream(endpoint=hub.url, policy=RetryPolicy(attempts=1, timeout=5.0))
        allowed = (UpstreamError,)
        with self.sandbox.guard():
            if variants_listing is not None:
                names = typed(lambda: up.list_variants(REPO, COMMIT), allowed, "list_variants")
                for name in names.value or []:
                    expect(
                        isinstance(name, str) and name and "/" not in name,
                        f"list_variants returned {name!r}",
                    )
            listed = typed(lambda: up.list_files(REPO, COMMIT, variant), allowed, "list_files")
            for f in listed.value or []:
                expect(isinstance(f.path, str), f"path {f.path!r}")
                expect(type(f.size) is int and f.size >= 0, f"{f.path!r}: size {f.size!r}")
                expect(
                    (f.sha256 is not None and HEX64.fullmatch(f.sha256))
                    or (f.git_sha1 is not None and HEX40.fullmatch(f.git_sha1)),
                    f"{f.path!r}: no valid content id ({f.sha256!r}, {f.git_sha1!r})",
                )
            fetcher = Fetcher(self.store, [up], attempts_per_file=1)
            blobs_before = self.store.space.usage().blobs
            fetched = typed(
                lambda: fetcher.fetch_variant(REPO, COMMIT, variant),
                (UpstreamError, StoreError),
                "fetch_variant",
            )
            self.sandbox.check_target_contained()
        if isinstance(fetched.error, InvalidInputError):
            # "rejected ...: the upstream manifest is malformed or hostile, nothing was written"
            expect(
                self.store.space.usage().blobs == blobs_before,
                f"a hostile listing was refused ({fetched.error}) after downloading its files",
            )
        if fetched.value is not None:
            tree = fetched.value.tree
            expect(inside(tree.path, self.sandbox.target), f"tree {tree.path} outside the store")
            for file in tree.path.rglob("*"):
                if file.is_file():
                    rel = file.relative_to(tree.path).as_posix()
                    expect(files.get(rel) == file.read_bytes(), f"{rel!r} is not what was served")


# ---- Resolve / ResolveMany request handling (kerneld.server) -----------------------------------


class Aborted(Exception):
    """What `context.abort` raises in the in-process servicer calls (grpc raises its own)."""


class ServicerContext:
    """The calls the Kernels servicer makes on a grpc.ServicerContext. A call has a deadline
    (`deadline_s`, as every kerneld_client call does), so the bounded-wait path is fuzzed."""

    def __init__(self, deadline_s: float | None = 30.0) -> None:
        self.code: Any = None
        self.details = ""
        self.trailers: tuple[tuple[str, bytes], ...] = ()
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: tuple[tuple[str, bytes], ...]) -> None:
        self.trailers = metadata

    def abort(self, code: Any, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted(details)


def check_error_detail(detail: Any, what: str) -> None:
    """An ErrorDetail a client will see: typed (not INTERNAL) and explained."""
    from kerneld_client.proto import kerneld_pb2 as pb

    code = pb.ErrorCode.Name(detail.code)
    expect(
        detail.code != pb.ErrorCode.INTERNAL,
        f"{what}: internal error (an untyped exception in the daemon): {detail.message}",
    )
    expect(detail.message.strip(), f"{what}: {code} without a message")


class ResolveHarness:
    """The daemon's Kernels servicer in-process, over a real Core: a store in a sandbox and a
    mirror-dir upstream with real kernels (tests/fixtures_daemon.py)."""

    def __init__(self, root: Path, mirror: Path) -> None:
        from kerneld.config import UpstreamConfig, default_config
        from kerneld.server.core import Core
        from kerneld.server.fronts.rpc.kernels_service import KernelsService
        from kerneld.server.plumbing.metrics import Metrics

        self.sandbox = Sandbox(root)
        cfg = replace(
            default_config(system=False),
            source="fuzz",
            store_path=self.sandbox.target,
            upstreams=(UpstreamConfig("mirror", "mirror-dir", str(mirror)),),
            min_free_bytes=0,
            fetch_attempts=1,
            trust_allow=("kerneld-*/*",),  # the suite's own publishers (a mirror-only site)
        )
        (root / "no-hardware").mkdir(exist_ok=True)
        self.core = Core(cfg, metrics=Metrics(), hardware_root=root / "no-hardware")
        self.core.open()
        self.core.ready = True
        self.service = KernelsService(self.core)

    def close(self) -> None:
        self.core.close()

    def check_resolve(self, request: Any) -> None:
        """Resolve: a ResolvedKernel inside the store, or an abort with a typed ErrorDetail."""
        from kerneld.server.statuses import detail_from_trailers
        from kerneld_client.proto import kerneld_pb2 as pb

        context = ServicerContext()
        with self.sandbox.guard():
            try:
                response = self.service.Resolve(request, context)  # type: ignore[arg-type]
            except Aborted:
                response = None
            except Exception as exc:
                raise InvariantViolation(f"Resolve raised {exc!r} instead of aborting") from exc
        if response is None:
            detail = detail_from_trailers(context.trailers)
            if detail is None:
                raise InvariantViolation("Resolve aborted without an ErrorDetail trailer")
            check_error_detail(detail, "Resolve")
            expect(context.details == detail.message, "status message != ErrorDetail message")
            return
        expect(isinstance(response, pb.ResolveResponse), f"Resolve returned {response!r}")
        self._check_kernel(response.kernel, request)

    def check_resolve_many(self, request: Any) -> None:
        """ResolveMany: one result per request, each a kernel or a typed error."""
        from kerneld_client.proto import kerneld_pb2 as pb

        with self.sandbox.guard():
            response = typed(
                lambda: self.service.ResolveMany(request, ServicerContext()),  # type: ignore[arg-type]
                (),
                "ResolveMany",
            ).value
        assert isinstance(response, pb.ResolveManyResponse)
        expect(len(response.results) == len(request.requests), "ResolveMany lost results")
        for result, req in zip(response.results, request.requests, strict=True):
            if result.WhichOneof("result") == "error":
                check_error_detail(result.error, "ResolveMany")
            else:
                expect(result.HasField("kernel"), "ResolveMany result with neither field")
                self._check_kernel(result.kernel, req)

    def _check_kernel(self, kernel: Any, request: Any) -> None:
        expect(kernel.repo_id == request.kernel.repo_id, "answer for another repo")
        expect(HEX40.fullmatch(kernel.commit), f"commit {kernel.commit!r}")
        path = Path(kernel.path)
        expect(path.is_dir() and inside(path, self.sandbox.target), f"path {path} not in store")
        accepted = [v.variant for v in kernel.variants if v.accepted]
        expect(
            kernel.variant == request.variant if request.variant else kernel.variant in accepted,
            f"served variant {kernel.variant!r} was not asked for or accepted ({accepted})",
        )
        expect(kernel.lease.id, "a served kernel without a lease")
        for dep in kernel.dependencies:
            expect(Path(dep.path).is_dir() and inside(Path(dep.path), self.sandbox.target), "dep")
