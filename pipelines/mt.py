"""The pipeline's steps that need no Moses, one subcommand each (pipelines/Makefile calls them):

    python mt.py prepare IN_PREFIX OUT_PREFIX --src en --trg fr [--lines N] [--stride K] [--max-len 80]
    python mt.py symmetrize FWD REV OUT                  # grow-diag-final-and, Pharaoh "i-j" links
    python mt.py detok --lang fr IN OUT
    python mt.py report WORK OUT.md --systems "baseline rnn ..." [--tuner pro] [--test-ref REF] ...
    python mt.py tuners WORK OUT.md --systems ... [--tuners "mert pro-bp pro kbmira"]  # tuners side by side
    python mt.py reweight FILTERED.ini TUNED.ini -o OUT.ini   # TUNED's weights in the filtered model
    python mt.py table-path MOSES.ini [--table NAME]          # the file of a phrase table (the first)
    python mt.py positive MOSES.ini FEATURE...                # mert's -P list: every score of each FEATURE
    python mt.py pro-features FEATURES.dat NAMES              # PRO's names (F<j>) of those scores
    python mt.py best-iteration MERT.log                      # the iteration --return-best-dev kept
    python mt.py nbest-top NBEST... N -o OUT                  # each sentence's first N of each list, merged
    python mt.py rerank-tune NBEST --ref REF --ini INI --moses DIR -o WEIGHTS  # reranking weights
    python mt.py rerank NBEST WEIGHTS --source SRC -o OUT     # each sentence's best under them
    python mt.py json-field FILE KEY                          # one field of a step's JSON result
    python mt.py timed TIMES.tsv STEP -- COMMAND...           # run COMMAND, log its wall time
    python mt.py with-cslm [--cslm C] [--serve-args=ARGS] MODEL PORT -- COMMAND...  # with the model's server up
    python mt.py preflight --moses DIR [--tuner T] [--cslm-systems] [--nnjm-systems]  # every tool a run needs

Each job lives in its own module beside this one (corpus, ini_steps, runs, report, tuners, preflight,
cslm_server);
this file only reads the command line. Every output is written atomically (a temporary file renamed
on success), so make never sees a half-written file.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mtcommon.errors import UserError
from mtcommon.textio import iter_lines

import corpus
import cslm_server
import files
import ini_steps
import preflight
import rerank
import report
import runs
import tuners


def _rerank_apply(a) -> None:
    sentences = sum(1 for _ in iter_lines(a.source))
    files.write_lines(a.output, rerank.rerank(a.nbest, rerank.read_weights(a.weights), sentences))


def _nbest_top(a) -> None:
    from mtcommon.nbest import top

    read, kept = top(a.nbest, a.output, a.n)
    lists = a.nbest[0] if len(a.nbest) == 1 else f"{len(a.nbest)} lists"
    print(f"{lists}: kept {kept:,} of {read:,} hypotheses ({a.n} a sentence from each at most, repeats dropped)",
          file=sys.stderr)


def _best_iteration(a) -> None:
    best = ini_steps.best_iteration(a.log)
    if best is None:  # the recipe then scores a decoding of its own
        sys.exit(1)
    print(best)


def _command(a, usage: str, options_after: bool = False) -> list[str]:
    """The command that follows a subcommand's own arguments (and its `--`); SystemExit with `usage` if there
    is none (or, with `options_after`, if it starts with an option: one of the subcommand's, given too late)."""
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command or (options_after and command[0].startswith("-")):
        raise SystemExit(f"mt.py {a.cmd}: {usage}")
    return command


def _timed(a) -> None:
    sys.exit(runs.timed(a.times, a.step, _command(a, "no command")))


def _with_cslm(a) -> None:
    command = _command(a, "give the options before MODEL PORT, then -- and the command", options_after=True)
    sys.exit(cslm_server.with_server(a.model, a.port, command, a.cslm, shlex.split(a.serve_args), a.wait))


def _preflight(a) -> None:
    tools = ["perl", a.moses_rnn, a.sacrebleu, a.eflomal] + ([a.cslm] if a.cslm_systems or a.nnjm_systems else [])
    missing = preflight.missing_for_run(Path(a.moses), a.tuner, tools, a.cslm_systems, a.nnjm_systems)
    if missing:
        raise SystemExit(preflight.MESSAGE + "; ".join(missing))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("input", help="prefix: INPUT.SRC and INPUT.TRG")
    a.add_argument("output", help="prefix of the outputs")
    a.add_argument("--src", required=True)
    a.add_argument("--trg", required=True)
    a.add_argument("--lines", type=int, default=0, help="use only the first N (sampled) lines (0: all)")
    a.add_argument("--stride", type=int, default=1, help="use every K-th line (a sample across the corpus)")
    a.add_argument("--max-len", type=int, default=0, help="drop pairs with a side longer than this (0: keep all)")
    a.add_argument("--max-ratio", type=float, default=9.0)
    a.add_argument("--no-lowercase", dest="lowercase", action="store_false")
    a.set_defaults(fn=lambda a: corpus.prepare(a.input, a.output, a.src, a.trg, a.lines, a.stride, a.max_len,
                                                  a.max_ratio, a.lowercase))
    a = sub.add_parser("symmetrize")
    a.add_argument("forward")
    a.add_argument("reverse")
    a.add_argument("output")
    a.set_defaults(fn=lambda a: corpus.symmetrize(a.forward, a.reverse, a.output))
    a = sub.add_parser("detok")
    a.add_argument("input")
    a.add_argument("output")
    a.add_argument("--lang", required=True)
    a.set_defaults(fn=lambda a: corpus.detok(a.input, a.output, a.lang))
    a = sub.add_parser("rerank-tune", help="weights for a rescored dev n-best list (Moses's extractor and mert)")
    a.add_argument("nbest")
    a.add_argument("--ref", required=True, help="the tokenized dev references")
    a.add_argument("--ini", required=True, help="the tuned moses.ini: the starting weights")
    a.add_argument("--moses", required=True)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--restarts", type=int, default=20)
    a.add_argument("--positive", default="", help="features whose weights stay above 0 (mert -P)")
    a.add_argument("--free", default="", help="the features whose weights may move, by spaces (mert -o); "
                   "the others keep the tuned ones (default: all move)")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=lambda a: rerank.tune(a.nbest, a.ref, a.ini, a.moses, a.output, seed=a.seed,
                                               positive=a.positive.split(), restarts=a.restarts,
                                               free=a.free.split() or None))
    a = sub.add_parser("rerank", help="each sentence's best hypothesis of a rescored n-best list")
    a.add_argument("nbest")
    a.add_argument("weights")
    a.add_argument("--source", required=True, help="the source sentences (their count)")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=_rerank_apply)
    a = sub.add_parser("report")
    a.add_argument("work")
    a.add_argument("output")
    a.add_argument("--systems", required=True,
                   help="the systems (pipelines/Makefile's SYSTEMS), by spaces or commas; the first is the baseline "
                        "of the paired tests")
    a.add_argument("--test-ref", help="the test references: with them, paired bootstrap tests against the baseline")
    a.add_argument("--tuner", default="mert", choices=sorted(runs.TUNER_FLAGS), help="whose tunings: systems/S/TUNER-K")
    a.add_argument("--tuner-args", default="", help="the options the tuner's optimiser was given (pipelines/Makefile's "
                                                    "TUNER_ARGS), named in the report; pro's -b makes the tunings pro-bp-K")
    a.add_argument("--restarts", type=int, default=runs.MERT_RESTARTS,
                   help="mert's random restarts (pipelines/Makefile's RESTARTS): other than 20, the tunings are "
                        "systems/S/mert-rN-K")
    a.add_argument("--tuning", help="the tunings' folder name (pipelines/Makefile's TUNING): systems/S/TUNING-K; "
                                    "default: the tuner's, as --restarts makes it")
    a.add_argument("--samples", type=int, default=1000, help="bootstrap samples")
    a.add_argument("--ar-samples", type=int, default=10000, help="samples of the two tests over all tunings")
    a.add_argument("--dev-ref", help="the tokenized dev references (dev.TRG): with --plot, dev BLEU per MERT iteration")
    a.add_argument("--plot", help="PNG of the dev BLEU of every MERT iteration of every tuning")
    a.add_argument("--training-plot", help="PNG of the phrase networks' held-out perplexity against their updates")
    a.add_argument("--test-src", help="the tokenized test sources (test.SRC): with --shortlist and --test-ref, BLEU on "
                                      "the sentences with a word outside the shortlist")
    a.add_argument("--shortlist", help="the word-level RNN's source vocabulary (rnn/model/src.vocab); skipped if absent")
    a.add_argument("--test-trg", help="the tokenized test references (test.TRG): with --networks, the no-unknown subset")
    a.add_argument("--pairs", default="", help="SYSTEM:BASE pairs tested as each system is against the baseline")
    a.add_argument("--networks", default="", help="networks that translated the test set alone (WORK/NAME/test.detok)")
    a.add_argument("--length-plot", help="PNG of test BLEU by source length of every system and network")
    a.add_argument("--label", default="", help="a line above the table (what kind of run this is)")
    a.set_defaults(fn=report.write_report)
    a = sub.add_parser("tuners", help="the tuners side by side on the same systems")
    a.add_argument("work")
    a.add_argument("output")
    a.add_argument("--systems", required=True, help="the systems, by spaces or commas")
    a.add_argument("--tuners", default="mert kbmira pro", help="the tuners (or the names of their tunings, TUNING), the first the one the others are tested "
                                                              "against (by spaces or commas)")
    a.add_argument("--restarts", type=int, default=runs.MERT_RESTARTS, help="mert's random restarts (its tunings' folders)")
    a.add_argument("--test-ref", help="the test references: with them, approximate randomization against the first tuner")
    a.add_argument("--dev-ref", help="the tokenized dev references: iterations, verdicts and --plot")
    a.add_argument("--ar-samples", type=int, default=10000)
    a.add_argument("--plot", help="PNG of every tuning's dev BLEU per iteration")
    a.add_argument("--label", default="", help="the picture's title")
    a.set_defaults(fn=tuners.write_tuners_report)
    a = sub.add_parser("reweight")
    a.add_argument("filtered", help="moses.ini of the filtered model")
    a.add_argument("tuned", help="moses.ini with the tuned [weight] section")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=lambda a: ini_steps.reweight(a.filtered, a.tuned, a.output))
    a = sub.add_parser("table-path")
    a.add_argument("ini")
    a.add_argument("--table", help="the phrase table's feature name (default: the first phrase table)")
    a.set_defaults(fn=lambda a: print(ini_steps.table_path(a.ini, a.table)))
    a = sub.add_parser("positive")
    a.add_argument("ini")
    a.add_argument("features", nargs="+", help="feature names (LexicalReordering0 ...)")
    a.set_defaults(fn=lambda a: print(",".join(ini_steps.positive_score_names(a.ini, a.features))))
    a = sub.add_parser("pro-features", help="PRO's names (F<j>) of scores named as mert names them")
    a.add_argument("features", help="a features file of the tuning (mert/run1.features.dat)")
    a.add_argument("names", help="comma-separated score names, as `mt.py positive` prints them (may be empty)")
    a.set_defaults(fn=lambda a: print(",".join(ini_steps.pro_score_names(a.features, a.names.split(",")))))
    a = sub.add_parser("preflight")
    a.add_argument("--moses", required=True, help="the Moses checkout (with bin/ built)")
    a.add_argument("--tuner", default="mert", choices=sorted(preflight.TUNER_NEEDS))
    a.add_argument("--moses-rnn", default="moses-rnn")
    a.add_argument("--cslm", default="cslm")
    a.add_argument("--sacrebleu", default="sacrebleu")
    a.add_argument("--eflomal", default="eflomal-align")
    a.add_argument("--cslm-systems", action="store_true", help="the run has CSLM systems (cslm, kenlm needed)")
    a.add_argument("--nnjm-systems", action="store_true", help="the run has NNJM systems (cslm, the NNJM feature)")
    a.set_defaults(fn=_preflight)
    a = sub.add_parser("best-iteration")
    a.add_argument("log", help="mert-moses.pl's log (stdout)")
    a.set_defaults(fn=_best_iteration)
    a = sub.add_parser("nbest-top", help="the first N hypotheses of each sentence of each n-best list, merged "
                                         "per sentence, repeated hypotheses dropped")
    a.add_argument("nbest", nargs="+")
    a.add_argument("n", type=int)
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=_nbest_top)
    a = sub.add_parser("json-field")
    a.add_argument("file")
    a.add_argument("key")
    a.set_defaults(fn=lambda a: print(files.json_field(a.file, a.key)))
    a = sub.add_parser("with-cslm", help="run a command with `cslm serve MODEL --port PORT` up, one server shared "
                                          "by the commands that run at the same time (cslm_server.py)")
    a.add_argument("model")
    a.add_argument("port", type=int)
    a.add_argument("--cslm", default="cslm", help="the cslm executable")
    a.add_argument("--serve-args", default="", help="more options for `cslm serve`, as one string "
                                                     "(--serve-args='--self-normalized ...')")
    a.add_argument("--wait", type=float, default=300.0, help="seconds the server may take to listen")
    a.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command, after MODEL PORT")
    a.set_defaults(fn=_with_cslm)
    a = sub.add_parser("timed")
    a.add_argument("times", help="the TSV file the step's seconds are appended to")
    a.add_argument("step")
    a.add_argument("command", nargs=argparse.REMAINDER)
    a.set_defaults(fn=_timed)
    args = p.parse_args(argv)
    try:
        args.fn(args)
    except (UserError, OSError, ValueError) as e:  # bad or missing input (a cut gzip corpus too): one line
        raise SystemExit(f"mt.py {args.cmd}: {e}") from None


if __name__ == "__main__":
    main()
