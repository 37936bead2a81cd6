"""numpy.einsum as one index-notation statement: each label is a dimension, a label repeated within an operand
reads its diagonal, labels absent from the output are summed, "..." stands for broadcast leading axes."""

from __future__ import annotations

from superopt.builder import GraphBuilder
from superopt.ops._util import idx, reshape_alias

Label = str | int  # a letter, or the position of an axis among the broadcast ("...") axes


def _parse_term(term: str, rank: int, what: str) -> list[Label]:
    """One operand's subscripts as labels; its "..." axes are numbered from the right (-1 is the last)."""
    if term.count("...") > 1 or "." in term.replace("...", ""):
        raise ValueError(f"einsum: {what} {term!r} has a malformed ellipsis")
    pre, ell, post = term.partition("...")
    for c in pre + post:
        if not c.isalpha() or not c.isascii():
            raise ValueError(f"einsum: {what} {term!r} has the character {c!r} (only letters and '...')")
    n_ell = rank - len(pre) - len(post)
    if (not ell and n_ell != 0) or n_ell < 0:
        raise ValueError(f"einsum: {what} {term!r} does not fit an operand of rank {rank}")
    return list(pre) + [k - n_ell for k in range(n_ell)] + list(post)


def _dim(label: Label) -> str:
    return f"l{label}" if isinstance(label, str) else f"e{-label}"


def einsum(b: GraphBuilder, equation: str, *xs: str) -> str:
    """numpy.einsum(equation, *xs): explicit ("ij,jk->ik") or implicit output ("ij,jk": the labels seen once,
    in ASCII order (upper case first), after the broadcast axes); size-1 axes broadcast."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ValueError(f"einsum: {equation!r} has {len(terms)} operand(s) but {len(xs)} were given")
    labels = [_parse_term(t, len(b.shape(x)), f"operand {k} subscripts") for k, (t, x) in enumerate(zip(terms, xs))]
    extent: dict[Label, int] = {}
    for k, (ls, x) in enumerate(zip(labels, xs)):
        for lab, n in zip(ls, b.shape(x)):
            if n == 0:
                raise ValueError(f"einsum: operand {k} has an empty axis (shape {b.shape(x)})")
            m = extent.get(lab, 1)
            if m != 1 and n != 1 and m != n:
                name = "'...'" if isinstance(lab, int) else repr(lab)
                raise ValueError(f"einsum: {name} has extent {m} and {n} in {equation!r}")
            extent[lab] = max(m, n)
    ellipsis = sorted(lab for lab in extent if isinstance(lab, int))
    if arrow:
        if "..." not in rhs and ellipsis:
            raise ValueError(f"einsum: {equation!r} needs '...' in its output for the broadcast axes")
        out = _parse_term(rhs, len(rhs.replace("...", "")) + len(ellipsis), "output subscripts")
        seen: set[Label] = set()
        for lab in out:
            if lab not in extent:
                raise ValueError(f"einsum: output label {lab!r} of {equation!r} is in no operand")
            if lab in seen:
                raise ValueError(f"einsum: output label {lab!r} of {equation!r} repeats")
            seen.add(lab)
    else:
        counts: dict[str, int] = {}
        for ls in labels:
            for lab in ls:
                if isinstance(lab, str):
                    counts[lab] = counts.get(lab, 0) + 1
        out = ellipsis + sorted(c for c, n in counts.items() if n == 1)
    out_dims = [_dim(lab) for lab in out]
    out_shape = [extent[lab] for lab in out]
    reduce = [lab for lab in extent if lab not in out]
    ext = {_dim(lab): n for lab, n in extent.items()}
    local: dict[str, str] = {}
    reads = []
    for ls, x in zip(labels, xs):
        if not ls:  # a rank-0 operand: index notation needs one axis
            x = reshape_alias(b, x, (1,))
        name = local.setdefault(x, f"A{len(local)}")
        ix = [_dim(lab) if n == extent[lab] else "0" for lab, n in zip(ls, b.shape(x))] if ls else ["0"]
        reads.append(f"{name}[{idx(ix)}]")
    if not out_dims:  # a scalar result: one axis of extent 1, then reshaped away
        out_dims = ["u"]
        ext["u"] = 1
    src = f"O[{idx(out_dims)}] {'+=' if reduce else '='} {' * '.join(reads)}"
    res = b.compute1(src, {v: k for k, v in local.items()}, "einsum", extents=ext)
    return reshape_alias(b, res, tuple(out_shape)) if not out else res

