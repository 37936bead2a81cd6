"""TfIdfVectorizer (opset 9) over integer token ids, as the ``tfidf`` extern (string pools have no superopt type)."""

from __future__ import annotations

from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx


@_conv("TfIdfVectorizer")
def _tfidf(c: _Ctx, x):
    pool = c.attr("pool_int64s")
    if pool is None:
        raise OnnxImportError("TfIdfVectorizer with pool_strings: superopt holds no string tensors")
    (y,) = c.b.extern("tfidf", [x[0]], name="tfidf", pool=[int(v) for v in pool],
                      ngram_counts=[int(v) for v in c.attr("ngram_counts", [])],
                      ngram_indexes=[int(v) for v in c.attr("ngram_indexes", [])],
                      min_n=int(c.attr("min_gram_length")), max_n=int(c.attr("max_gram_length")),
                      max_skip=int(c.attr("max_skip_count")), mode=str(c.attr("mode")),
                      weights=[float(v) for v in c.attr("weights", [])])
    return y
