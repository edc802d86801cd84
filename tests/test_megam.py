"""pipelines/megam.py: megam's command line for mert-moses.pl's PRO (Hopkins & May 2011) on scipy's L-BFGS."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MEGAM = ROOT / "pipelines" / "megam.py"

# get_weights_from_mert in Moses's scripts/training/mert-moses.pl, as Python `re`
DENSE = re.compile(r"^F(\d+) ([\-\.\de]+)")
SPARSE = re.compile(r"^(.+_.+) ([\-\.\de]+)")


_spec = importlib.util.spec_from_file_location("megam_script", MEGAM)
MOD = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MOD)


def run_main(*args):
    """main() in this process (quicker than a subprocess): (exit status, stdout, stderr)."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = MOD.main(list(args))  # reports and returns: it never raises
    out.flush()
    return rc, out.buffer.getvalue().decode(), err.getvalue()


def megam(*args, cwd, stdin=None):
    return subprocess.run([sys.executable, str(MEGAM), *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=60)


def mert_moses_read(text: str, n_dense: int):
    """What get_weights_from_mert makes of megam's output: dense and sparse weights, L1-normalised."""
    dense, sparse, total = [0.0] * n_dense, {}, 0.0
    for line in text.splitlines():
        if m := DENSE.match(line):
            dense[int(m[1])] = float(m[2])
            total += abs(float(m[2]))
        elif m := SPARSE.match(line):
            sparse[m[1]] = float(m[2])
    assert total >= 1e-9, "mert-moses.pl would die: 'feature values are invalid'"
    return [v / total for v in dense], {k: v / total for k, v in sparse.items()}


def write_pro_data(path: Path, w_dense, w_sparse: dict, n_pairs=1500, seed=0):
    """Data as Moses's pro.cpp writes it: per pair, `1 diff` and `0 -diff`; dense F<j> features with
    |diff| > 1e-5 only, then sparse `name value ` pairs after a double space."""
    rng = np.random.default_rng(seed)
    names = list(w_sparse)
    w = np.array(list(w_dense) + [w_sparse[k] for k in names])
    nd = len(w_dense)
    with open(path, "w") as f:
        for _ in range(n_pairs):
            x = rng.normal(size=len(w)) * rng.uniform(0.2, 3.0, size=len(w))
            x[rng.random(len(w)) < 0.2] = 0.0  # some features equal in both hypotheses
            if x @ w + rng.normal(scale=0.5) < 0:  # noisy: the better one first
                x = -x
            for lab, d in ((1, x), (0, -x)):
                dense = "".join(f" F{j} {d[j]:g}" for j in range(nd) if abs(d[j]) > 1e-5)
                sparse = "".join(f"{names[k]} {d[nd + k]:g} " for k in range(len(names)) if abs(d[nd + k]) > 1e-5)
                f.write(f"{lab}{dense}" + (f"  {sparse}" if sparse else "") + "\n")
    return w


def test_recovers_weight_direction_as_subprocess_from_another_cwd(tmp_path):
    w_dense, w_sparse = [1.0, -2.0, 0.5, 0.0, 3.0], {"wp_a": 1.5, "lex_b~c": -1.0}
    w = write_pro_data(tmp_path / "run1.pro.data", w_dense, w_sparse)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # mert-moses.pl's call: `$pro_optimizer -fvals -maxi 30 -nobias binary run$run.pro.data`, relative path
    r = megam("-fvals", "-maxi", "30", "-nobias", "binary", "../run1.pro.data", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(DENSE.match(l) or SPARSE.match(l) for l in lines), lines
    assert not any(l.startswith("**BIAS**") for l in lines)
    dense, sparse = mert_moses_read(r.stdout, len(w_dense))
    got = np.array(dense + [sparse[k] for k in w_sparse])
    cos = got @ w / np.linalg.norm(got) / np.linalg.norm(w)
    assert cos > 0.97, (got, w)
    assert all(np.sign(got[i]) == np.sign(w[i]) for i in range(len(w)) if abs(w[i]) > 0.4)


def test_output_format_parses_with_mert_moses_regexes():
    m = MOD
    values = [1.5e-05, -2.5e-07, 1e5, -123456.789, 3e-11, 0.0, 1e20, -1e-10]
    lines = [l.decode() for l in m.format_weights([b"F%d" % i for i in range(len(values))], values, None)]
    assert len(lines) == 5  # 3e-11, 0 and -1e-10 left out: megam prints only |w| > 1e-10
    for line in lines:
        assert "+" not in line and "e" not in line.split()[1]
        mt = DENSE.match(line)
        assert mt and line.rstrip("\n") == mt[0]  # the regex takes the whole number
        assert float(mt[2]) == pytest.approx(values[int(mt[1])], rel=1e-12, abs=1e-20)
    sparse = m.format_weights([b"wp_x"], [-1.5e-05], 0.25)
    assert sparse[0] == b"**BIAS** 0.25000000000000000000\n"
    assert SPARSE.match(sparse[1].decode())[2] == "-0.00001500000000000000"


def test_bias_line_unless_nobias_and_lambda_shrinks(tmp_path):
    data = tmp_path / "d"
    data.write_text("1 F0 1\n" * 30 + "0 F0 -1\n" * 10 + "1 F0 -1\n" * 20 + "0 F0 1\n" * 5)
    rc, out, err = run_main("-fvals", "-quiet", "binary", str(data))
    assert rc == 0 and err == ""
    assert out.splitlines()[0].startswith("**BIAS** ") and float(out.split()[1]) > 0
    _, loose, _ = run_main("-fvals", "-nobias", "-quiet", "-lambda", "0.01", "binary", str(data))
    _, tight, _ = run_main("-fvals", "-nobias", "-quiet", "-lambda", "100", "binary", str(data))
    assert "**BIAS**" not in loose + tight
    assert float(DENSE.match(loose)[2]) > float(DENSE.match(tight)[2]) > 0


def test_bernoulli_format_stdin_comments_and_one_class(tmp_path):
    # without -fvals every token after the label is a feature of value 1; `-` reads stdin
    r = megam("-nobias", "binary", "-", cwd=tmp_path, stdin="# a comment\n\n1 good_a\n0 bad_b\n1 good_a bad_b\n")
    assert r.returncode == 0, r.stderr
    w = dict(l.split() for l in r.stdout.splitlines())
    assert float(w["good_a"]) > 0 > float(w["bad_b"])
    # one class only: no crash, a warning, weights pointing towards that class
    (tmp_path / "one").write_text("1 F0 2 F1 -1\n1 F0 1\n")
    rc, out, err = run_main("-fvals", "-nobias", "binary", str(tmp_path / "one"))
    assert rc == 0 and "all 2 examples are of class 1" in err
    dense, _ = mert_moses_read(out, 2)
    assert dense[0] > 0 > dense[1]
    # a DEV line ends the training data (megam's dev section is not used)
    (tmp_path / "dev").write_text("1 F0 1\n0 F0 -1\nDEV\n1 F0 -1\n0 F0 1\n1 F0 -5\n")
    rc, out, err = run_main("-fvals", "-nobias", "-quiet", "binary", str(tmp_path / "dev"))
    assert rc == 0 and float(DENSE.match(out)[2]) > 0


@pytest.mark.parametrize("content, message", [
    ("", "no training examples"),
    ("# only a comment\n\n", "no training examples"),
    ("1 F0 0.5\n0 F0 -0.5 F1\n", ":2: feature 'F1' has no value"),
    ("1 F0 abc\n", ":1: a feature value is not a number"),
    ("1 F0 1\n0 F0 nan\n", ":2: a feature value is not finite"),
    ("1 F0 1\n2 F0 1\n", ":2: label '2' is not 0 or 1"),
    ("-1 F0 1\n", ":1: label '-1' is not 0 or 1"),
    ("1 $$$WEIGHT 2 F0 1\n", ":1: megam's $$$ tags are not supported"),
])
def test_bad_data_is_one_line_naming_the_file(tmp_path, content, message):
    data = tmp_path / "run1.pro.data"
    data.write_text(content)
    rc, out, err = run_main("-fvals", "-maxi", "30", "-nobias", "binary", str(data))
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"megam.py: error: {data}") and message in err, err


def test_bad_data_as_subprocess_no_traceback(tmp_path):
    (tmp_path / "run1.pro.data").write_text("1 F0 1\n0.5 F0 1\n")
    r = megam("-fvals", "-maxi", "30", "-nobias", "binary", "run1.pro.data", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "megam.py: error: run1.pro.data:2: label '0.5' is not 0 or 1\n"


@pytest.mark.parametrize("args, message", [
    (["-fvals", "binary", "missing.data"], "missing.data: cannot open"),
    (["-fvals", "-frobnicate", "binary", "d"], "unknown option '-frobnicate'"),
    (["-fvals", "-tune", "binary", "d"], "megam option '-tune' is not supported"),
    (["-fvals", "multiclass", "d"], "model type 'multiclass' is not supported"),
    (["-maxi", "x", "binary", "d"], "-maxi expects an integer"),
    (["-maxi", "0", "binary", "d"], "-maxi should be >= 1"),
    (["-lambda", "-1", "binary", "d"], "-lambda should be >= 0"),
    (["-lambda", "binary", "d"], "-lambda expects an argument"),
    (["-nonneg", "binary", "d"], "-nonneg expects comma-separated feature names"),
    (["d"], "expected options, the model type and a file"),
])
def test_bad_command_line_is_one_line(args, message):
    rc, out, err = run_main(*args)
    assert rc != 0 and out == "" and err.count("\n") == 1 and message in err, err


def test_nonneg_is_the_constrained_optimum(tmp_path):
    """-nonneg (not megam's: PRO's side of the pipeline's POSITIVE) keeps the named weights at or
    above 0. The data want F1 < 0; with F1 bounded the fit is the constrained optimum: the
    objective's gradient is 0 in every free coordinate and points up (>= 0) in F1, held at 0 (KKT).
    Names the data lack are ignored; an empty list is no constraint."""
    data = tmp_path / "run1.pro.data"
    write_pro_data(data, [1.0, -0.8, 0.5], {}, n_pairs=800, seed=3)
    rc, free, _ = run_main("-fvals", "-maxi", "200", "-nobias", "-quiet", "binary", str(data))
    assert rc == 0
    w_free = mert_moses_read(free, 3)[0]
    assert w_free[1] < -0.1  # unconstrained, the data's sign
    rc, empty, _ = run_main("-fvals", "-maxi", "200", "-nobias", "-quiet", "-nonneg", "", "binary", str(data))
    assert rc == 0 and empty == free
    rc, out, _ = run_main("-fvals", "-maxi", "200", "-nobias", "-quiet", "-nonneg", "F1,F7,LM0_0", "binary", str(data))
    assert rc == 0
    w = np.zeros(3)
    for line in out.splitlines():
        m = DENSE.match(line)
        w[int(m[1])] = float(m[2])
    assert w[1] >= 0.0 and w[0] > 0 and w[2] > 0
    y01, indptr, indices, vals, names, _ = MOD.read_data(str(data), True)
    cols = np.array([int(n[1:]) for n in names])[indices]  # F<j> -> j
    X = np.zeros((len(y01), 3))
    np.add.at(X, (np.repeat(np.arange(len(y01)), np.diff(indptr)), cols), vals)
    s = 2.0 * y01 - 1.0
    r = -s / (1.0 + np.exp(s * (X @ w)))  # d/d score of sum log(1 + exp(-s w.x))
    grad = X.T @ r + 1.0 * w  # lambda = 1, megam's default
    assert abs(grad[0]) < 1e-3 * w[0] and abs(grad[2]) < 1e-3 * w[2]  # the prior's pull balances the data's
    assert w[1] == 0.0 and grad[1] > 0  # held at its bound, which the objective pushes against
