"""The CUDA backend: Triton kernels (top-level ``kernels/``) in the model's hooks, and what only a GPU needs.

``ops.py`` is the hook table of Triton adapters; ``decode_layer.py`` a decode layer in six launches;
``fused_moe.py`` the fused MoE kernels' glue; ``graphs/`` decode steps replayed from CUDA graphs (the same bucketed
path runs on the CPU, where capture is recorded rather than made); ``registration_check.py`` whether host memory
registration works here. Nothing here imports triton until a kernel is called.
"""
