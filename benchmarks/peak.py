"""Print this machine's FMA ceiling, register-tile ceiling and memory bandwidth (superopt.measure.peak).

    python benchmarks/peak.py [--threads 2] [--refresh] [--seconds 0.3] [--json] [--tiles]

--tiles also times every register tile that fills the register file against the FMA chains, and the default tile
written back every 64, 256 and 1024 reduction steps as a contraction's tiles are (not cached).

Results are cached per target under the compiler cache directory; --refresh measures again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from superopt.measure.peak import (  # noqa: E402
    fma_peak_gflops,
    measure_bandwidth,
    tile_peak_gflops,
    tile_sweep,
    tile_write_back_sweep,
)
from superopt.target import host_target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget of the FMA measurement")
    ap.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--tiles", action="store_true", help="also sweep the register tiles that fill the registers")
    args = ap.parse_args(argv)
    target = host_target(args.threads)
    peak = fma_peak_gflops(target, seconds=args.seconds, refresh=args.refresh)
    tile = tile_peak_gflops(target, refresh=args.refresh)
    bw = measure_bandwidth(target, refresh=args.refresh)
    tiles = tile_sweep(target) if args.tiles else None
    write_back = tile_write_back_sweep(target) if args.tiles else None
    if args.json:
        print(json.dumps({"target": target.to_dict(), "target_key": target.key(), "fma": peak.to_dict(),
                          "fma_from_cache": peak.from_cache,
                          "ceiling_gflops": peak.ceiling_gflops, "implied_ghz": peak.implied_ghz(target.fma_units),
                          "tile": tile.to_dict(), "tile_from_cache": tile.from_cache,
                          "bandwidth": bw.to_dict(), "bandwidth_from_cache": bw.from_cache,
                          "tiles": None if tiles is None else [{"rows": r, "vectors": v, "fma_fraction": f}
                                                               for r, v, f in tiles],
                          "write_back": None if write_back is None else [
                              {"steps": n, "alone_fma_fraction": a, "written_back_fma_fraction": w}
                              for n, a, w in write_back]}, indent=1))
        return 0
    cached = lambda r: " (cached)" if r.from_cache else ""  # noqa: E731
    print(f"target: {target.describe()}")
    print(f"FMA ceiling{cached(peak)}: {peak.gflops:.1f} GFLOP/s with {peak.threads} thread(s), "
          f"{peak.gflops_1t:.1f} with one (x{peak.scaling:.2f}; roofline ceiling {peak.ceiling_gflops:.1f}); "
          f"{peak.vector_bits}-bit vectors, "
          f"{peak.accumulators} chains per thread, implied clock {peak.implied_ghz(target.fma_units):.2f} GHz "
          f"at {target.fma_units} FMA pipes; measured {peak.measured_at}")
    print(f"register-tile ceiling{cached(tile)}: {tile.gflops:.1f} GFLOP/s with {tile.threads} thread(s), "
          f"{tile.gflops_1t:.1f} with one; {tile.rows} x {tile.vectors} vectors fed from L1 (broadcasts and "
          f"vector loads), {tile.fma_fraction:.2f} of the FMA-chain kernel (median of {tile.rounds} alternating rounds)"
          f"; measured {tile.measured_at}")
    print(f"memory bandwidth{cached(bw)}: triad {bw.triad_gbs:.1f} GB/s, copy {bw.copy_gbs:.1f} GB/s "
          f"({bw.threads} thread(s), 3 x {bw.array_bytes >> 20} MiB arrays); measured {bw.measured_at}")
    if tiles is not None:
        print("register tiles fed from L1, fraction of the FMA chains (alternating, median): "
              + ", ".join(f"{r} x {v} {f:.2f}" for r, v, f in tiles))
    if write_back is not None:
        print(f"the {tile.rows} x {tile.vectors} tile written back every N reduction steps, as a contraction's tiles "
              "are (alone -> written back, fraction of the FMA chains): "
              + ", ".join(f"N={n} {a:.2f} -> {w:.2f}" for n, a, w in write_back))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
