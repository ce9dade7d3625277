"""The gRPC front ends: the `Kernels` (user socket) and `Admin` (admin socket) servicers."""
