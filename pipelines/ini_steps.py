"""Look-ups and rewrites of Moses's own files that the Makefile's recipes need between Moses's
steps: a moses.ini's tables and weights, the tuners' names of its scores, a tuning log's kept iteration."""

from __future__ import annotations

from mtcommon.errors import UserError
from mtcommon.textio import iter_lines

from files import write_lines


def reweight(filtered_ini: str, tuned_ini: str, output: str) -> None:
    """FILTERED's moses.ini (the tables filtered to one set's sentences) with TUNED's [weight]
    section: both must weight the same features, else the filtered model is of another system."""
    from moses_rnn.formats.mosesini import MosesIni

    filtered = MosesIni.read(filtered_ini)
    filtered.copy_weights(MosesIni.read(tuned_ini))
    write_lines(output, filtered.lines)


def table_path(ini_path: str, table: str | None = None) -> str:
    """The file of a moses.ini's phrase table (--table NAME, else the first); Moses adds .gz
    to a path that does not exist, and so does this."""
    from moses_rnn.formats.mosesini import MosesIni

    ini = MosesIni.read(ini_path)
    tables = [ini.feature(table)] if table else ini.phrase_tables()
    if not tables or not tables[0].get("path"):
        raise ValueError(f"{ini_path}: no phrase table with a path")
    return tables[0].table_file()


def positive_score_names(ini_path: str, features: list[str]) -> list[str]:
    """The names mert's -P option takes (`NAME_0,NAME_1,...`, as in its feature files) for every
    tuned score of each named feature of a moses.ini: mert then keeps their weights above 0.

    mert numbers only a feature's tuneable scores, consecutively (a phrase table whose last column
    is fixed by tuneable-components=true,...,false has names _0 to _4 for its first five). A feature
    with no tuned score (tuneable=false) is refused."""
    from moses_rnn.formats.mosesini import MosesIni

    ini = MosesIni.read(ini_path)
    names = []
    for name in features:
        feature = ini.feature(name)
        if feature.get("tuneable") == "false":
            raise ValueError(f"{ini_path}: {name} is not tuned (tuneable=false)")
        count = feature.num_scores()
        if not count:
            raise ValueError(f"{ini_path}: cannot tell how many scores {name} has (no num-features=)")
        components = feature.get("tuneable-components")
        if components is not None:  # Moses's booleans (Scan<bool>): true/yes/1, false/no/0
            flags = [c.strip().lower() for c in components.split(",")]
            if len(flags) != count or any(f not in ("true", "yes", "1", "false", "no", "0") for f in flags):
                raise ValueError(f"{ini_path}: {name}'s tuneable-components={components} is not {count} booleans")
            count = sum(f in ("true", "yes", "1") for f in flags)
        names += [f"{name}_{i}" for i in range(count)]
    return names


def pro_score_names(features_file: str, names: list[str]) -> list[str]:
    """The names PRO's data gives the named scores (`F<j>,...`: pro writes each dense score
    as F followed by its position in the feature files), from the header of a features file that
    Moses's extractor wrote for the same tuning (`FEATURES_TXT_BEGIN_0 SENT N COUNT NAME...`);
    megam.py -nonneg takes them. A name the header lacks stops with one line naming the file."""
    wanted = [n for n in names if n]
    if not wanted:  # no constraint: the file is not read
        return []
    with open(features_file, "rb") as fh:
        header = fh.readline().decode("utf-8", "replace").split()
    if len(header) < 4 or header[0] != "FEATURES_TXT_BEGIN_0" or not header[3].isdigit() \
            or len(header) != 4 + int(header[3]):
        raise UserError(f"{features_file}: not a Moses features file (no FEATURES_TXT_BEGIN_0 header naming its scores)")
    column = {name: j for j, name in enumerate(header[4:])}
    missing = [n for n in wanted if n not in column]
    if missing:
        raise UserError(f"{features_file}: no score named {', '.join(missing)} (it has {' '.join(header[4:])})")
    return [f"F{column[n]}" for n in wanted]


def best_iteration(log: str) -> int | None:
    """The iteration whose weights mert-moses.pl --return-best-dev returned (its log's
    'copying weights from best iteration (N, bleu=...)'); None when the log has none."""
    best = None
    for _, line in iter_lines(log):
        if line.startswith("copying weights from best iteration ("):
            best = line.split("(", 1)[1].split(",", 1)[0]
    return int(best) if best is not None and best.isdigit() else None

