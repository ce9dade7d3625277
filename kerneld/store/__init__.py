"""kerneld's content-addressed store: blobs, read-only variant trees, the SQLite index, GC.

No gRPC here. The facade is :class:`Store`; the on-disk layout is documented in ``layout``, the
index jobs read in ``published_index``, the error hierarchy in ``errors``.
"""

from .blobs import BlobInfo, BlobWriter, Expected
from .errors import (
    BlobMissingError,
    DeniedError,
    DigestMismatchError,
    DuplicatePathError,
    IngestInProgressError,
    IntegrityError,
    InvalidInputError,
    InvalidPathError,
    LeaseNotFoundError,
    MetadataDigestError,
    MetadataError,
    PathConflictError,
    ProvenanceError,
    ReadOnlyStoreError,
    ResourceExhaustedError,
    SchemaError,
    SizeMismatchError,
    StoreError,
    StoreLockedError,
    StoreOwnershipError,
    TreeNotFoundError,
    UnresolvedDenyError,
    UnsupportedFileTypeError,
    log_context,
)
from .gc import GcPolicy, GcReport, TreeDecision
from .holds import Hold
from .interfaces import (
    BlobProvider,
    Catalog,
    FetchTarget,
    Ingester,
    Leases,
    Maintenance,
    Policy,
    PrefetchTarget,
    PublishTarget,
    ResolveTarget,
    Status,
    TreePublisher,
)
from .layout import FILE_MODE_EXEC
from .leasing import Lease
from .locks import TreeGone, hold_tree_lock
from .lookup import LookupHit, PublishedFile
from .manifest import TreeFile, VariantMetadata, tree_digest
from .ownership import store_exists, store_in_use
from .published_index import IndexHit
from .publishing import TreeInfo
from .signatures import ProvenanceCheck
from .space import Usage
from .store import Store
from .types import (
    ALL,
    DenyRow,
    LeaseRow,
    NegativeRow,
    PinRow,
    ProvenanceRecord,
    RefRow,
    TreeRow,
    VariantRow,
)
from .verify import Problem, VerifyReport

__all__ = [
    "ALL",
    "FILE_MODE_EXEC",
    "BlobInfo",
    "BlobMissingError",
    "BlobProvider",
    "BlobWriter",
    "Catalog",
    "DeniedError",
    "DenyRow",
    "DigestMismatchError",
    "DuplicatePathError",
    "Expected",
    "FetchTarget",
    "GcPolicy",
    "GcReport",
    "Hold",
    "IndexHit",
    "IngestInProgressError",
    "Ingester",
    "IntegrityError",
    "InvalidInputError",
    "InvalidPathError",
    "Lease",
    "LeaseNotFoundError",
    "LeaseRow",
    "Leases",
    "LookupHit",
    "Maintenance",
    "MetadataDigestError",
    "MetadataError",
    "NegativeRow",
    "PathConflictError",
    "PinRow",
    "Policy",
    "PrefetchTarget",
    "Problem",
    "ProvenanceCheck",
    "ProvenanceError",
    "ProvenanceRecord",
    "PublishTarget",
    "PublishedFile",
    "ReadOnlyStoreError",
    "RefRow",
    "ResolveTarget",
    "ResourceExhaustedError",
    "SchemaError",
    "SizeMismatchError",
    "Status",
    "Store",
    "StoreError",
    "StoreLockedError",
    "StoreOwnershipError",
    "TreeDecision",
    "TreeFile",
    "TreeGone",
    "TreeInfo",
    "TreeNotFoundError",
    "TreePublisher",
    "TreeRow",
    "UnresolvedDenyError",
    "UnsupportedFileTypeError",
    "Usage",
    "VariantMetadata",
    "VariantRow",
    "VerifyReport",
    "hold_tree_lock",
    "log_context",
    "store_exists",
    "store_in_use",
    "tree_digest",
]
