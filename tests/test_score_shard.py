"""Sharded scoring under torchrun: two CPU processes write the single-process bytes, or nothing."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from moses_rnn.cli import main

COPIES = 8  # the example table 8 times: 3,232 lines, 13 windows of 256


def big_table(example_table, folder, gz: bool = False, bad_line: int | None = None):
    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True) * COPIES
    if bad_line is not None:
        lines[bad_line - 1] = lines[bad_line - 1].replace(" ||| ", " |||  ||| ", 1)  # an empty target
    data = "".join(lines).encode("utf-8")
    path = folder / ("table.gz" if gz else "table.txt")
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return path


def torchrun(*args, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "moses_rnn.cli", "score", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("gz_in, out_name, window", [(False, "out.gz", 256), (True, "out.txt", 4096)])
def test_two_processes_write_the_single_process_bytes(tmp_path, example_table, tiny_model, gz_in, out_name, window):
    """Plain input (cut by byte offset), and gzip input (windows dealt round-robin) with a window so large
    that the second process has nothing to do: the output is the single-process run's, byte for byte, with
    the same compression (gzip bytes included), and no part file is left behind."""
    table = big_table(example_table, tmp_path, gz=gz_in)
    single, sharded = tmp_path / f"single.{out_name}", tmp_path / out_name
    opts = ["-m", tiny_model, "--window", window, "--unknown", "--quiet"]
    r = CliRunner().invoke(main, ["score", str(table), "-o", str(single), *map(str, opts)])
    assert r.exit_code == 0, r.output
    p = torchrun(table, "-o", sharded, *opts)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"{len(example_table.read_text().splitlines()) * COPIES} lines" in p.stderr
    assert "2 torchrun processes" in p.stderr
    assert sharded.read_bytes() == single.read_bytes()
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted([table.name, single.name, sharded.name])


def test_dtype_auto_is_chosen_alike_by_every_process(tmp_path, example_table, tiny_model):
    """`--dtype auto` under torchrun: the processes add up their probes' times (or, without native bfloat16,
    take float32 untimed) and so choose one dtype, and the output is the single-process bytes of that dtype."""
    table = big_table(example_table, tmp_path)
    opts = ["-m", tiny_model, "--window", 256, "--device", "cpu"]
    p = torchrun(table, "-o", tmp_path / "auto.gz", *opts, "--dtype", "auto", "--quiet")
    assert p.returncode == 0, p.stderr[-3000:]
    chosen = re.search(r"on cpu, (bf16|fp32) \(2 torchrun processes", p.stderr).group(1)
    single = tmp_path / "single.gz"
    r = CliRunner().invoke(main, ["score", str(table), "-o", str(single), *map(str, opts), "--dtype", chosen,
                                  "--quiet"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "auto.gz").read_bytes() == single.read_bytes()


def test_a_bad_line_in_the_second_shard_fails_the_whole_run(tmp_path, example_table, tiny_model):
    """Line 3,001 lies in the second process's share: both stop, the message names the file and the line as
    a single process would, the previous output is untouched and no temporary is left."""
    table = big_table(example_table, tmp_path, bad_line=3001)
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    p = torchrun(table, "-m", tiny_model, "-o", out, "--window", 256, "--quiet")
    assert p.returncode != 0
    assert f"Error: {table}:3001: empty target phrase" in p.stderr
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.gz", "table.txt"]


def test_stdin_and_stdout_are_refused_when_sharded(tmp_path, example_table, tiny_model):
    from moses_rnn.scoring.scorer import PhraseScorer
    from moses_rnn.scoring.table import score_table
    from mtcommon.runtime import Distributed

    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    for table, out in [(str(example_table), "-"), ("-", str(tmp_path / "out.gz"))]:
        with pytest.raises(ValueError, match=r"sharded scoring \(torchrun\) needs a table file and an output file"):
            score_table(scorer, table, out, progress=False, dist=Distributed(rank=0, world=2))
    assert list(tmp_path.iterdir()) == []


def test_line_blocks_and_byte_ranges(tmp_path):
    """The readers the shards are built on: blocks of whole lines from any line start, newline counts of
    byte ranges, and the line start after k newlines."""
    import random

    from mtcommon.textio import after_newlines, count_newlines, iter_line_blocks

    r = random.Random(5)
    lines = [("x" * r.randrange(0, 3000) + "\n").encode() for _ in range(5000)] + [b"last, no newline"]
    data = b"".join(lines)
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    blocks = list(iter_line_blocks(str(path), 700))
    assert [f for f, _ in blocks] == list(range(1, len(lines) + 1, 700))
    assert b"".join(b for _, b in blocks) == data and all(b.count(b"\n") == 700 for _, b in blocks[:-1])
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    blocks = list(iter_line_blocks(str(path), 300, start=starts[1234], first_line=1235, max_lines=1000))
    assert [f for f, _ in blocks] == [1235, 1535, 1835, 2135] and b"".join(b for _, b in blocks) == b"".join(lines[1234:2234])
    assert count_newlines(str(path), 100, 7_000_000) == data.count(b"\n", 100, 7_000_000)
    assert after_newlines(str(path), starts[10] - 1, 3) == starts[12]
    assert after_newlines(str(path), 0, 10**6) == len(data)
