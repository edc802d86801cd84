#!/usr/bin/env python3
"""A drop-in replacement for megam (Hal Daume III's MEGA Model Optimization Package) as Moses's
PRO tuning calls it, so that `mert-moses.pl --pairwise-ranked` runs on machines that cannot
download `megam_i686.opt`:

    python pipelines/megam.py [options] binary FILE      (FILE `-`: stdin)

reads PRO's pairs (megam's -fvals format: `LABEL NAME VALUE ...`, labels 0 and 1), fits megam's
`binary` logistic regression (summed log-likelihood, a Gaussian prior of precision -lambda, the
bias included) with scipy's L-BFGS-B, and prints `name weight` lines as megam does (`%10.20f`,
weights with |w| <= 1e-10 left out), which mert-moses.pl reads back.

options (megam's names and defaults; the last two arguments are always the model type and the
file, as in megam):
    -fvals          feature values follow their names (without it, every
                    token after the label is a feature with value 1)
    -maxi N         at most N optimiser iterations (default 100)
    -lambda X       precision of the Gaussian prior, i.e. L2 weight (default 1)
    -memory N       L-BFGS memory (default 5)
    -nobias         no bias feature (mert-moses.pl passes it)
    -quiet          no progress output on stderr
    -nonneg NAMES   (not megam's) keep the weights of these comma-separated
                    features at or above 0 (empty: none): the box-constrained
                    fit that mert's -P does for MERT.  The pipeline passes
                    PRO's names (F<j>) for the scores of its POSITIVE features.

Where it deviates from megam (docs/pipeline.md, "PRO's optimiser", has megam's own behaviour):
labels other than 0 and 1 stop it; DEV and TEST sections end the training data and $$$ tags are
an error; data with one class only is fitted as it is, with a warning.
"""

from __future__ import annotations

import sys
from array import array

try:
    import numpy as np
    import scipy  # noqa: F401  (scipy.optimize and scipy.sparse are imported where used)
except ImportError as e:  # run by an interpreter without the project's environment
    sys.exit(f"megam.py: error: {e.name} is not installed for {sys.executable} (pip install scipy)")

PROG = "megam.py"
USAGE = "usage: megam.py [-fvals] [-maxi N] [-lambda X] [-memory N] [-nobias] [-quiet] [-nonneg NAMES] binary FILE"
# megam options that this replacement does not implement: refused by name.
MEGAM_ONLY = {"-filespec", "-explicit", "-dpp", "-tune", "-sprog", "-sfile", "-sargs", "-sspec", "-sforcef",
              "-predict", "-mean", "-init", "-minfc", "-bnsfs", "-abffs", "-curve", "-repeat", "-lastweight",
              "-multilabel", "-bitvec", "-nc", "-pa", "-kernel", "-norm1", "-norm2", "-no-ood", "-no-id", "-online"}


class UsageError(Exception):
    pass


class DataError(Exception):
    pass


def parse_args(argv: list[str]) -> dict:
    """megam's command line: options, then <model-type> <input-file>."""
    if len(argv) < 2:
        raise UsageError("expected options, the model type and a file")
    opts = {"fvals": False, "maxi": 100, "lambda": 1.0, "memory": 5, "bias": True, "quiet": False, "nonneg": set()}
    *flags, model, path = argv
    i = 0
    while i < len(flags):
        a = flags[i]
        i += 1
        if a == "-fvals":
            opts["fvals"] = True
        elif a == "-nobias":
            opts["bias"] = False
        elif a == "-quiet":
            opts["quiet"] = True
        elif a == "-nonneg":
            if i >= len(flags):
                raise UsageError("-nonneg expects comma-separated feature names")
            opts["nonneg"] = {n.encode() for n in flags[i].split(",") if n}
            i += 1
        elif a in ("-maxi", "-lambda", "-memory"):
            if i >= len(flags):
                raise UsageError(f"{a} expects an argument")
            conv = float if a == "-lambda" else int
            try:
                value = conv(flags[i])
            except ValueError:
                raise UsageError(f"{a} expects {'a float' if conv is float else 'an integer'}, not {flags[i]!r}")
            low = {"-maxi": 1, "-lambda": 0.0, "-memory": 2}[a]
            if not value >= low:  # also refuses nan
                raise UsageError(f"{a} should be >= {low}")
            opts[a[1:]] = value
            i += 1
        elif a in MEGAM_ONLY:
            raise UsageError(f"megam option {a!r} is not supported by this replacement")
        else:
            raise UsageError(f"unknown option {a!r}")
    if model != "binary":
        raise UsageError(f"model type {model!r} is not supported (only 'binary')")
    opts["path"] = path
    return opts


def read_data(path: str, fvals: bool):
    """Examples as CSR arrays: (labels 0/1, indptr, indices, values, feature names, file name for messages)."""
    name = "<stdin>" if path == "-" else path
    vocab: dict[bytes, int] = {}  # feature name -> column, in order of first appearance
    labels, indptr, indices, values, lines = array("b"), array("q", [0]), array("i"), array("d"), array("q")
    try:
        fh = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as e:
        raise DataError(f"{name}: cannot open: {e.strerror}")
    with fh:
        for ln, line in enumerate(fh, 1):
            toks = line.split()
            if not toks or toks[0].startswith(b"#"):
                continue
            if toks[0] in (b"DEV", b"TEST") and len(toks) == 1:
                break  # megam's dev/test sections: not used for training
            lab = toks[0]
            if lab == b"1" or lab == b"0":
                labels.append(lab == b"1")
            else:
                try:
                    y = float(lab)
                except ValueError:
                    y = None
                if y not in (0.0, 1.0):
                    raise DataError(f"{name}:{ln}: label {lab.decode(errors='replace')!r} is not 0 or 1")
                labels.append(y == 1.0)
            if b"$$$" in line:
                raise DataError(f"{name}:{ln}: megam's $$$ tags are not supported")
            if fvals:
                if len(toks) % 2 == 0:
                    raise DataError(f"{name}:{ln}: feature {toks[-1].decode(errors='replace')!r} has no value")
                feats = toks[1::2]
                try:
                    values.extend(map(float, toks[2::2]))
                except ValueError:
                    raise DataError(f"{name}:{ln}: a feature value is not a number")
            else:
                feats = toks[1:]
                values.extend([1.0] * len(feats))
            try:
                ids = list(map(vocab.__getitem__, feats))
            except KeyError:  # a feature not seen before
                ids = [vocab.setdefault(f, len(vocab)) for f in feats]
            indices.extend(ids)
            indptr.append(len(indices))
            lines.append(ln)
    if not labels:
        raise DataError(f"{name}: no training examples")
    vals = np.frombuffer(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        row = np.searchsorted(np.frombuffer(indptr, dtype=np.int64), bad[0], side="right") - 1
        raise DataError(f"{name}:{lines[row]}: a feature value is not finite")
    return (np.frombuffer(labels, dtype=np.int8), np.frombuffer(indptr, dtype=np.int64),
            np.frombuffer(indices, dtype=np.int32), vals, list(vocab), name)


def fit(y01, X, lam: float, bias: bool, maxi: int, memory: int, nonneg=None):
    """Minimise sum_n log(1 + exp(-s_n (w.x_n + b))) + lam/2 (|w|^2 + b^2), s_n = 2 y_n - 1,
    with L-BFGS (megam's objective; PRO is this logistic regression, Hopkins & May 2011).
    nonneg: a boolean per column of X whose weight must stay >= 0 (L-BFGS-B's bounds; the
    problem stays convex, so the fit is the constrained optimum)."""
    from scipy.optimize import minimize
    from scipy.special import expit

    s = 2.0 * y01 - 1.0
    d = X.shape[1]

    def f(theta):
        w, b = theta[:d], (theta[d] if bias else 0.0)
        m = s * (X @ w + b)  # margins
        r = -s * expit(-m)  # d loss / d score
        loss = np.logaddexp(0.0, -m).sum() + 0.5 * lam * theta @ theta
        grad = np.empty_like(theta)
        grad[:d] = X.T @ r + lam * w
        if bias:
            grad[d] = r.sum() + lam * b
        return loss, grad

    if d + bias == 0:  # nothing to fit: no features and -nobias
        return np.zeros(0), 0.0, 0
    bounds = None
    if nonneg is not None and np.any(nonneg):
        bounds = [(0.0, None) if c else (None, None) for c in nonneg] + [(None, None)] * bias
    res = minimize(f, np.zeros(d + bias), jac=True, method="L-BFGS-B", bounds=bounds,
                   options={"maxiter": maxi, "maxcor": memory})
    return res.x[:d], (float(res.x[d]) if bias else 0.0), res.nit


def format_weights(names: list[bytes], w: list[float], bias: float | None) -> list[bytes]:
    """megam's output lines: `**BIAS** b` (unless bias is None), then `name w`; megam's printf
    format "%10.20f" is fixed point, so no exponent (and no `+`) for mert-moses.pl's `[\\-\\.\\de]+`;
    |w| <= 1e-10 is left out, as megam does."""
    out = [b"**BIAS** %10.20f\n" % bias] if bias is not None and abs(bias) > 1e-10 else []
    out.extend(b"%s %10.20f\n" % (n, v) for n, v in zip(names, w) if abs(v) > 1e-10)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        opts = parse_args(argv)
        y01, indptr, indices, vals, names, fname = read_data(opts["path"], opts["fvals"])
    except UsageError as e:
        print(f"{PROG}: error: {e}; {USAGE}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    from scipy.sparse import csr_matrix

    X = csr_matrix((vals, indices, indptr), shape=(len(y01), len(names)))  # duplicates add up, as in megam
    quiet = opts["quiet"]
    y = y01.astype(np.float64)
    n_pos = int(y.sum())
    if not quiet and n_pos in (0, len(y)):
        print(f"{PROG}: warning: {fname}: all {len(y)} examples are of class {int(n_pos > 0)}", file=sys.stderr)
    nonneg = np.array([n in opts["nonneg"] for n in names], dtype=bool)
    w, b, nit = fit(y, X, opts["lambda"], opts["bias"], opts["maxi"], opts["memory"], nonneg)
    if not np.all(np.isfinite(w)) or not np.isfinite(b):
        print(f"{PROG}: error: {fname}: the optimiser diverged (try a larger -lambda)", file=sys.stderr)
        return 1
    out = format_weights(names, w.tolist(), b if opts["bias"] else None)
    sys.stdout.buffer.write(b"".join(out))
    sys.stdout.flush()
    if not quiet:
        print(f"{PROG}: {fname}: {len(y01)} examples, {len(names)} features, {nit} L-BFGS iterations "
              f"(max {opts['maxi']}), {len(out)} weights written", file=sys.stderr)
        if not out:
            print(f"{PROG}: warning: {fname}: all weights are zero", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
