"""A training script whose entry point torchrun's `@record` wraps: the exception also lands
in the launcher's error file, and torchrun's summary box quotes its traceback."""

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    raise RuntimeError("CUDA error: out of memory while allocating 2.00 GiB on rank 1")


main()
