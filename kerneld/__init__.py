"""kerneld: the host daemon and admin CLI that own a verified store of Kernel Hub kernels."""

__version__ = "0.1.0"
