"""Running a call on a given torch thread count (the native CPU ops promise bits independent of it)."""
import torch


def with_threads(count: int, fn):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(count)
        return fn()
    finally:
        torch.set_num_threads(threads)
