"""Gradient compression, as Horovod's ``hvd.Compression``.

``Compression.none``, ``Compression.fp16`` and (kolo's addition)
``Compression.bf16``. With ``allreduce(..., compression=...)`` the tensor is
cast in Python before the allreduce and back after it, as in Horovod. With
``DistributedOptimizer(..., compression=...)`` the C++ gradient pipeline does
the casting (float32 and float64 gradients only); a compressor of your own
cannot be passed to it (docs/python.md).
"""
import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx) -> tensor."""

    # The C++ pipeline's name for it ("none", "fp16", "bf16"); None = a
    # compressor kolo's DistributedOptimizer cannot run.
    kolo_name = None

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    kolo_name = "none"

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.dtype:
            return tensor.type(cls.dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.type(ctx)


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as IEEE half precision."""

    kolo_name = "fp16"
    dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16 (kolo's addition)."""

    kolo_name = "bf16"
    dtype = torch.bfloat16


class Compression:
    """The compressors, by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
