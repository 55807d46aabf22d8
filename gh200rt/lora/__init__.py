"""LoRA adapters served beside the base model (docs/LORA.md).

Contract:
- An adapter is a PEFT directory (``peft_adapter.read_peft_adapter``), read into host memory in the layout of
  the device slots: per decoder layer and fused linear (``qkv_proj``, ``o_proj``, ``gate_up_proj``,
  ``down_proj``) an ``A [R, in]`` and a ``B [out, R]``; a fused linear's parts stack block-diagonally (q, k, v
  rows of B each read their own rank block of A).
- ``AdapterRegistry`` (``registry.py``) names adapters, keeps at most ``--max-cpu-loras`` of them in host memory
  (LRU; an evicted one is read again from its path) and owns the ``--max-loras`` device slots (``slots.py``),
  booked in the ledger as ``lora_slots``. Between steps ``begin_step`` copies the step's adapters into slots.
- A step's per-token slot index travels as a ``LoraStep`` (``step.py``) that the model runner sets on the one
  ``LoraBatch`` the LoRA linears were given at install; every ``RefLinear`` with a ``lora`` adds
  ``(x @ A_slot^T) @ B_slot^T * scale_slot`` per token (``kernels/triton/lora_sgmv.py``). Tokens of the base model have
  slot -1 and get nothing added.
- The scheduler admits at most ``--max-loras`` distinct adapters among running sequences; the prefix cache salts
  a sequence's block hashes with its adapter id, so KV is never shared across adapters.
"""
