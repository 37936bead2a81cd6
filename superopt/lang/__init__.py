"""The op language: index notation over named dimensions, parsed (never eval'd) into the IR.

    V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]
"""

from superopt.lang.errors import OpLangError
from superopt.lang.parser import compile_op, parse_compute

__all__ = ["OpLangError", "compile_op", "parse_compute"]
