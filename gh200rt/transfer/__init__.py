"""Transfer scheduler backends (cpu_backend.py; CUDA backend to follow)."""
