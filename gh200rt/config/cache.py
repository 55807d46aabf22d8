"""``CacheConfig``: the KV cache's blocks, element type and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help, parse_size

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's values; fp8 = fp8_e4m3
KV_OFFLOADING_BACKENDS = ("native",)
KV_WRITE_POLICIES = ("write_through", "write_back")
KV_HOST_READS = ("auto", "load", "in_place")
PREFIX_HASH_ALGOS = ("builtin", "sha256")     # vLLM's --prefix-caching-hash-algo names


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=flag_help("tokens per KV cache block"))
    num_kv_blocks: int | None = field(default=None, metadata=flag_help(
        "KV cache blocks; default: what the device memory budget leaves"))
    enable_prefix_caching: bool = field(default=True, metadata=flag_help("reuse KV blocks of shared prompt prefixes"))
    kv_cache_dtype: str = field(default="auto", metadata=flag_help(
        "KV cache element type: auto (the compute dtype), fp8 / fp8_e4m3 (e4m3 with a K and a V scale per layer; "
        "half of bf16), fp8_e5m2 (wider range, one mantissa bit less)", choices=KV_CACHE_DTYPES))
    calculate_kv_scales: bool = field(default=False, metadata=flag_help(
        "with an fp8 KV cache, set each layer's K and V scales from the first batch (its largest magnitude over "
        "the fp8 maximum); otherwise the checkpoint's k_scale / v_scale, or 1.0"))
    kv_offloading_size: str | None = field(default=None, metadata=flag_help(
        "host memory for a second KV tier that keeps the prefix cache's blocks after their device slots are reused "
        "(loaded back instead of recomputed): GiB as in vLLM (e.g. 8), a size with its unit (512MiB), or auto (what "
        "host memory has left after the host weights and a margin); off unless given"))
    kv_offloading_backend: str = field(default="native", metadata=flag_help(
        "who keeps the host KV tier: native (this process's host memory)"))
    kv_offloading_write_policy: str = field(default="write_through", metadata=flag_help(
        "when a block is copied to the host tier: write_through (as soon as it is published, on a copy thread: "
        "evictions and preemptions find it there already) or write_back (when it becomes free, fewer bytes copied "
        "but a block reused before its copy ran is lost)", choices=KV_WRITE_POLICIES))
    kv_offloading_reads: str = field(default="auto", metadata=flag_help(
        "how a prefix found in the host KV tier is read: load (copied into device blocks before the step that reads "
        "it), in_place (attention reads the host blocks where they lie, over NVLink-C2C on GH200 or PCIe: no device "
        "blocks, no copy; needs attention kernels that read host blocks: the GPU's, or --cpu-kernels torch) or auto "
        "(per request on a GPU: in place where the device pool cannot take the hit's blocks now, or the request "
        "computes its prompt only; else loaded)", choices=KV_HOST_READS))
    prefix_caching_hash_algo: str = field(default="builtin", metadata=flag_help(
        "the prefix cache's block hash: builtin (Python's hash, fastest; this process only) or sha256 (stable "
        "across processes and restarts)", choices=PREFIX_HASH_ALGOS))
    kv_offloading_disk_dir: str | None = field(default=None, metadata=flag_help(
        "a third KV tier on local disk: every block the host tier stores is also written here (off the step's "
        "path), a lookup continues here past host memory, and the blocks survive a restart; needs "
        "--kv-offloading-size and --prefix-caching-hash-algo sha256; off unless given"))
    kv_offloading_disk_size: float | None = field(default=None, metadata=flag_help(
        "GiB the disk tier may fill, least recently used blocks deleted beyond it; default: half the free space "
        "of the directory's filesystem at start-up"))

    def __post_init__(self):
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("--calculate-kv-scales sets the scales of an fp8 KV cache; add --kv-cache-dtype fp8 "
                             "(or drop --calculate-kv-scales)")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size} (16 is the default)")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be at least 1, got {self.num_kv_blocks}")
        if self.kv_offloading_backend == "lmcache":
            raise ValueError("--kv-offloading-backend lmcache: LMCache is not part of gh200rt; use "
                             "--kv-offloading-backend native (the host tier in this process's memory)")
        if self.kv_offloading_backend not in KV_OFFLOADING_BACKENDS:
            raise ValueError(f"--kv-offloading-backend {self.kv_offloading_backend!r}: choose "
                             f"{' or '.join(KV_OFFLOADING_BACKENDS)}")
        if self.kv_offloading_write_policy not in KV_WRITE_POLICIES:
            raise ValueError(f"--kv-offloading-write-policy {self.kv_offloading_write_policy!r}: choose one of "
                             f"{', '.join(KV_WRITE_POLICIES)}")
        if self.kv_offloading_reads not in KV_HOST_READS:
            raise ValueError(f"--kv-offloading-reads {self.kv_offloading_reads!r}: choose one of "
                             f"{', '.join(KV_HOST_READS)}")
        if self.kv_offloading_reads != "auto" and self.kv_offloading_size is None:
            raise ValueError(f"--kv-offloading-reads {self.kv_offloading_reads} says how the host KV tier's blocks "
                             "are read; add --kv-offloading-size (e.g. 4, or auto)")
        if self.prefix_caching_hash_algo not in PREFIX_HASH_ALGOS:
            raise ValueError(f"--prefix-caching-hash-algo {self.prefix_caching_hash_algo!r}: choose one of "
                             f"{', '.join(PREFIX_HASH_ALGOS)}")
        if self.kv_offloading_size is not None:
            if not self.enable_prefix_caching:
                raise ValueError("--kv-offloading-size keeps the prefix cache's blocks in host memory; it needs "
                                 "prefix caching (drop --no-enable-prefix-caching)")
            self.kv_offloading_bytes    # a size that cannot be read is refused here, with the flag's name
        if self.kv_offloading_disk_size is not None and self.kv_offloading_disk_dir is None:
            raise ValueError("--kv-offloading-disk-size sizes the disk tier; add --kv-offloading-disk-dir DIR")
        if self.kv_offloading_disk_size is not None and self.kv_offloading_disk_size <= 0:
            raise ValueError(f"--kv-offloading-disk-size must be positive, got {self.kv_offloading_disk_size} (GiB)")
        if self.kv_offloading_disk_dir is not None:
            if self.kv_offloading_size is None:
                raise ValueError("--kv-offloading-disk-dir extends the host KV tier to disk; add "
                                 "--kv-offloading-size (e.g. 4, or auto)")
            if self.prefix_caching_hash_algo != "sha256":
                raise ValueError("--kv-offloading-disk-dir keeps blocks across restarts, which finds them again only "
                                 "under a hash that is the same in every process; add --prefix-caching-hash-algo "
                                 "sha256")

    @property
    def kv_offloading_bytes(self) -> int | None:
        """The host KV tier's size in bytes; None when off or ``auto`` (the plan decides)."""
        size = self.kv_offloading_size
        if size is None or str(size).strip().lower() == "auto":
            return None
        text = str(size).strip()
        try:
            gib = float(text)
        except ValueError:
            try:
                return parse_size(text, "--kv-offloading-size")
            except ValueError:
                raise ValueError(f"--kv-offloading-size: cannot read {text!r}; give GiB (8, as vLLM reads it), a size "
                                 f"with its unit (512MiB) or auto") from None
        if gib <= 0:
            raise ValueError(f"--kv-offloading-size must be positive, got {text} (GiB); leave it out to turn the "
                             "host KV tier off")
        return int(gib * 2**30)

    @property
    def kv_offloading_auto(self) -> bool:
        return self.kv_offloading_size is not None and str(self.kv_offloading_size).strip().lower() == "auto"
