"""kerneld_client: load Kernel Hub kernels through the host's kerneld daemon.

Importing this package is cheap on purpose: it imports neither grpc, huggingface_hub, torch nor
kerneld. Those are imported lazily by the code paths that need them.
"""

__version__ = "0.1.0"
