"""Model families (Llama/Mistral, Qwen2/Qwen3) behind the contract in ``gh200rt.models.base``;
``registry.build_model(arch, dtype)`` builds one from an ``ArchConfig``."""
