"""The CPU backend: every mechanism of the engine on the host's cores, with native C kernels (``kernels/cpu/``).

``routes.py`` picks the compute route (bf16 / fp16 / fp32) for this CPU; ``prepack.py`` gives resident linears that
route's fastest form (``amx_weight.py``: the native tile-packed bf16 weights); ``native.py`` builds and loads the C
library and ``native_ops.py`` calls it on tensors (``native_checks.py``, ``native_args.py``: the argument checks and
blocks); ``ops.py`` is the hook table and ``decode_layer.py`` a decode step's layer in one native call;
``linear.py`` float32 linears of a few rows; ``host_allocator.py`` keeps a step's freed memory mapped.
"""
