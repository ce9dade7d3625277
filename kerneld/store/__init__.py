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
    UnsupportedFileTypeError,
    log_context,
)
from .gc import GcPolicy, GcReport, TreeDecision
from .holds import Hold
from .index import ProvenanceRecord, RefRow
from .interfaces import (
    BlobProvider,
    FetchTarget,
    Ingester,
    Leases,
    Maintenance,
    Policy,
    ResolveTarget,
    TreePublisher,
)
from .leasing import Lease
from .locks import TreeGone, hold_tree_lock
from .lookup import LookupHit, PublishedFile
from .manifest import TreeFile, VariantMetadata, tree_digest
from .published_index import IndexHit
from .publishing import TreeInfo
from .signatures import ProvenanceCheck
from .space import Usage
from .store import Store
from .verify import Problem, VerifyReport

__all__ = [
    "BlobInfo",
    "BlobMissingError",
    "BlobProvider",
    "BlobWriter",
    "DeniedError",
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
    "Leases",
    "LookupHit",
    "Maintenance",
    "MetadataDigestError",
    "MetadataError",
    "PathConflictError",
    "Policy",
    "Problem",
    "ProvenanceCheck",
    "ProvenanceError",
    "ProvenanceRecord",
    "PublishedFile",
    "ReadOnlyStoreError",
    "RefRow",
    "ResolveTarget",
    "ResourceExhaustedError",
    "SchemaError",
    "SizeMismatchError",
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
    "UnsupportedFileTypeError",
    "Usage",
    "VariantMetadata",
    "VerifyReport",
    "hold_tree_lock",
    "log_context",
    "tree_digest",
]
