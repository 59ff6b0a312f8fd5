"""spec_sample on each kernel path for a few mixes, side by side in one run (the quick timing
of a device iteration; `python -m specdec_lib bench spec_sample` is the full table).

    PYTHONPATH=... python3 tools/sample_paths.py [--paths tiles,rows] [--batches 64,16]
"""
import argparse

from specdec_lib.bench import Bench
from specdec_lib.bench.sampling import _env, _timed
from specdec_lib.ops.sampling import PATH_ENV

MIXES = (   # greedy fraction, top_p, top_k, label
    (0.5, 0.9, 0, "half greedy, top-p 0.9"),
    (0.5, 1.0, 0, "half greedy, no filter"),
    (0.5, 0.9, 50, "half greedy, top-k 50 + top-p 0.9"),
    (0.5, 0.99, 0, "half greedy, top-p 0.99"),
    (0.0, 0.9, 0, "all sampled, top-p 0.9"),
    (1.0, 1.0, 0, "all greedy"),
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="tiles,rows")
    ap.add_argument("--batches", default="64")
    ap.add_argument("--mixes", default="", help="label substrings to keep (comma separated)")
    a = ap.parse_args()
    keep = [m for m in a.mixes.split(",") if m]
    b = Bench(0)
    try:
        for B in (int(x) for x in a.batches.split(",")):
            for greedy_frac, top_p, top_k, label in MIXES:
                if keep and not any(m in label for m in keep):
                    continue
                for path in a.paths.split(","):
                    with _env(**{PATH_ENV: path}):
                        run = _timed(b, B, 3, 151936, greedy_frac, top_p, None, top_k, label,
                                     impl=f"specdec_lib({path} path)")
                        del run
    finally:
        b.close()


if __name__ == "__main__":
    main()
