"""The CUDA backend: Triton kernels (top-level ``kernels/``) in the model's hooks, and what only a GPU needs.

``ops.py`` is the hook table of Triton adapters; ``decode_layer.py`` a decode layer in six launches;
``fused_moe.py`` the fused MoE kernels' glue; ``graph_capture.py`` the capture and replay of one decode bucket's
CUDA graph (the engine's bucketed decode path, ``engine/decode_graphs/``, runs on the CPU too, with a stand-in); ``registration_check.py`` whether host memory
registration works here. Nothing here imports triton until a kernel is called.
"""
