"""Weight formats: how a linear weight is stored in host memory, as device-free data types.

``pack.py``: ``pack_weight``, the one entry point that makes a weight's host form (``--host-weight-dtype``), and the
torch reference every form is checked against; ``packed_weight.py``: ``PackedWeight`` (int8 / int4 / fp8, layouts in
``packed_layout.py``, made by ``quantizers.py`` or imported losslessly from GGUF blocks by ``gguf_blocks.py``);
``half_weight.py``: ``HalfWeight`` (fp16). A format knows its bytes, not how to multiply them: ``weight.linear(x)``
asks ``backend_linear.py`` for the backend of ``x``'s device, which decides (``backends/cpu/packed_linear.py``,
``backends/cpu/half_linear.py``, ``backends/cuda/format_linear.py``).
"""
