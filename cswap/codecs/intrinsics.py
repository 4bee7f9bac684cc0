"""LLVM intrinsics for the Numba CPU kernels: the bit operations Numba cannot express.

A 32-lane "!= 0" whose ``<32 x i1>`` result is the bitmap word itself (one vector compare and mask
move on AVX-512/AVX2, where a scalar loop of compare-shift-or does not vectorise), and the popcount
and trailing-zero count instructions. They sit below the ZVC wire format and every backend, so the
format's validation (:mod:`cswap.codecs.popcount`) and the CPU kernels (:mod:`cswap.codecs.zvc_cpu`)
share them without importing each other.

Example:
    >>> import numpy as np
    >>> from numba import njit
    >>> @njit
    ... def bits(word):
    ...     return popcount(word), low_bit(word)
    >>> bits(np.uint32(0b10100))
    (2, 2)
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core.base import BaseContext
from numba.core.typing.context import Context
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

__all__ = ["low_bit", "nonzero_mask32", "popcount"]

#: What a Numba intrinsic's typing function returns: the signature and the LLVM code generator.
_Intrinsic = tuple[Signature, Callable[[BaseContext, ir.IRBuilder, Signature, list[ir.Value]], ir.Value]]


@intrinsic
def nonzero_mask32(typingctx: Context, array: types.Type, start: types.Type) -> _Intrinsic | None:
    """Bit ``j`` set iff ``array[start + j] != 0``, for ``j < 32``; the caller keeps ``start + 32 <= array.size``."""
    if not (isinstance(array, types.Array) and isinstance(array.dtype, types.Integer) and array.layout == "C"):
        return None

    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        lanes = ir.VectorType(context.get_value_type(signature.args[0].dtype), 32)
        pointer = builder.bitcast(builder.gep(data, [args[1]]), lanes.as_pointer())
        block = builder.load(pointer, align=1)
        nonzero = builder.icmp_unsigned("!=", block, ir.Constant(lanes, None))
        return builder.bitcast(nonzero, ir.IntType(32))

    return types.uint32(array, types.intp), codegen


@intrinsic
def popcount(typingctx: Context, word: types.Type) -> _Intrinsic | None:
    """Set bits in the low 32 bits of an integer."""
    if not isinstance(word, types.Integer):
        return None

    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        low = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.zext(builder.ctpop(low), ir.IntType(64))

    return types.int64(word), codegen


@intrinsic
def low_bit(typingctx: Context, word: types.Type) -> _Intrinsic | None:
    """Index of the lowest set bit in the low 32 bits of an integer, which must not all be zero."""
    if not isinstance(word, types.Integer):
        return None

    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]) -> ir.Value:
        low = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.zext(builder.cttz(low, ir.Constant(ir.IntType(1), 1)), ir.IntType(64))

    return types.int64(word), codegen
