"""Diagnostic: run pytest with the one-row GEMV routes switched back to cuBLAS / the tiled host_gemm."""
import sys

import pytest

import gh200rt.kernels.host_gemm as hg
import gh200rt.models.gpu_kernels as gk
from gh200rt.models.layers import cpu_linear

gk.TRITON_OPS["dense_linear"] = cpu_linear.dense_linear
hg.host_gemm = lambda x, w, b=None, split_k=None: hg.tiled_host_gemm(x, w, b, split_k)
sys.exit(pytest.main(sys.argv[1:]))
