"""Triton kernels, one op per file, each beside its torch reference (installed as gh200rt.kernels)."""
