"""Edit Moses configuration files (moses.ini) without disturbing them.

A moses.ini is a list of `[section]` headers each followed by lines. The
`[feature]` section has one line per feature function, `Type key=value ...`,
and the `[weight]` section one line per feature name, `Name= w1 w2 ...`.
A feature without `name=` is called Type + index (the index counts earlier
features of the same Type), which is how Moses names it.

`MosesIni` keeps every line of the file verbatim (comments, blank lines,
sections it does not know) and rewrites only the lines an edit touches, so
`MosesIni.parse(text).render() == text` for any file.

Feature names must be usable by MERT (mert-moses.pl splits on `_`), so new
names are checked: letters, digits and `-`/`.`, starting with a letter.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from mtcommon import features
from mtcommon.errors import UserError
from mtcommon.textio import InputError, iter_lines

#: Feature types that are phrase tables (their scores are table columns).
PHRASE_TABLE_TYPES = (
    "PhraseDictionaryMemory",
    "PhraseDictionaryBinary",
    "PhraseDictionaryCompact",
    "PhraseDictionaryOnDisk",
    "PhraseDictionaryScope3",
    "PhraseDictionaryALSuffixArray",
    "PhraseDictionaryTransliteration",
    "ProbingPT",
)

SECTION_RE = re.compile(r"^\s*\[([^\]]+)\]\s*$")

# Feature types whose default number of scores Moses knows without num-features=.
_DEFAULT_SCORES = {
    "UnknownWordPenalty": 1, "WordPenalty": 1, "PhrasePenalty": 1, "Distortion": 1,
    "KENLM": 1, "SRILM": 1, "IRSTLM": 1, "LM": 1, "CSLM": 2,
    "InputFeature": 1, "OpSequenceModel": 5, "SoftSourceSyntacticConstraintsFeature": 3,
}


# A new column's starting weight: small, so that the first tuning step does not overshoot (at 0.2 the RNN
# system started 0.50 dev BLEU below its baseline: docs/pipeline.md, "Tuning").
COLUMN_WEIGHT = 0.05

class IniError(UserError):
    """An edit that cannot be made, or a file that is not a usable moses.ini."""


def check_name(name: str) -> str:
    """Return `name` if MERT accepts it as a feature name (`mtcommon.features`), else raise IniError."""
    try:
        return features.check_name(name)
    except UserError as e:
        raise IniError(str(e)) from None


@dataclass
class Feature:
    """One line of the [feature] section."""

    index: int              # line index in MosesIni.lines
    type: str
    args: list[list[str]]   # [key, value] pairs in file order (value may be None for a bare token)
    name: str

    def get(self, key: str) -> str | None:
        for k, v in self.args:
            if k == key:
                return v
        return None

    def set(self, key: str, value: str) -> None:
        for kv in self.args:
            if kv[0] == key:
                kv[1] = value
                return
        self.args.append([key, value])

    def num_scores(self) -> int | None:
        n = self.get("num-features")
        if n is not None:
            try:
                return int(n)
            except ValueError:
                raise IniError(f"feature {self.name}: num-features={n!r} is not a number") from None
        return _DEFAULT_SCORES.get(self.type)

    def render(self) -> str:
        parts = [self.type] + [k if v is None else f"{k}={v}" for k, v in self.args]
        return " ".join(parts)

    def table_file(self) -> str | None:
        """The file this phrase table's path= names, as Moses opens it: Moses adds .gz to a path
        that does not exist. None without a path=."""
        path = self.get("path")
        if path is not None and not os.path.exists(path) and os.path.exists(path + ".gz"):
            path += ".gz"
        return path

    def table_columns(self) -> int:
        """The number of scores on the first line of the text phrase table this feature points at."""
        from .phrasetable import parse_line

        path = self.table_file()
        if not path:
            raise IniError(f"feature {self.name} has no path=")
        if not os.path.isfile(path):
            raise IniError(f"{self.name}'s table {path} is not a file here (a relative path is read from the "
                           "current folder, as Moses reads it)")
        for lineno, line in iter_lines(path):
            return len(parse_line(line, path, lineno).scores)
        raise InputError(path, None, "the phrase table is empty")


@dataclass
class MosesIni:
    """A moses.ini as a list of lines plus an index of sections, features and weights."""

    lines: list[str]
    newline: str = "\n"
    trailing_newline: bool = True
    features: list[Feature] = field(default_factory=list)
    path: str = "moses.ini"  # where it was read from, for messages

    # ---- reading -------------------------------------------------------
    @classmethod
    def parse(cls, text: str, path: str = "moses.ini") -> "MosesIni":
        newline = "\r\n" if "\r\n" in text else "\n"
        lines = text.split(newline)
        trailing = lines[-1] == ""
        if trailing:
            lines.pop()
        ini = cls(lines=lines, newline=newline, trailing_newline=trailing, path=path)
        ini._index(path)
        return ini

    @classmethod
    def read(cls, path: str) -> "MosesIni":
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(path, data.count(b"\n", 0, e.start) + 1, f"invalid UTF-8 ({e.reason})") from None
        return cls.parse(text, path)

    def render(self) -> str:
        text = self.newline.join(self.lines)
        return text + self.newline if self.trailing_newline and self.lines else text

    def write(self, path: str) -> None:
        from mtcommon.outputs import atomic_output

        with atomic_output(path, compress=False) as out:
            out.write(self.render().encode("utf-8"))

    def _sections(self) -> list[tuple[str, int, int]]:
        """(name, header line index, end index exclusive) for each section."""
        heads = [(m.group(1).strip(), i) for i, line in enumerate(self.lines) if (m := SECTION_RE.match(line))]
        out = []
        for j, (name, i) in enumerate(heads):
            end = heads[j + 1][1] if j + 1 < len(heads) else len(self.lines)
            out.append((name, i, end))
        return out

    def section(self, name: str) -> tuple[int, int] | None:
        for sec, i, end in self._sections():
            if sec == name:
                return i, end
        return None

    @staticmethod
    def _content(line: str) -> str:
        s = line.strip()
        return "" if not s or s.startswith("#") else s

    def _index(self, path: str) -> None:
        self.features = []
        seen: dict[str, int] = {}
        counts: dict[str, int] = {}
        span = self.section("feature")
        if span is None:
            return
        for i in range(span[0] + 1, span[1]):
            s = self._content(self.lines[i])
            if not s:
                continue
            tokens = s.split()
            ftype, args = tokens[0], []
            for tok in tokens[1:]:
                k, eq, v = tok.partition("=")
                args.append([k, v if eq else None])
            feat = Feature(i, ftype, args, "")
            name = feat.get("name")
            if name is None:
                name = f"{ftype}{counts.get(ftype, 0)}"
            counts[ftype] = counts.get(ftype, 0) + 1
            if name in seen:
                raise InputError(path, i + 1, f"feature name {name} is used twice")
            seen[name] = i
            feat.name = name
            self.features.append(feat)

    # ---- queries -------------------------------------------------------
    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise IniError(f"no feature named {name!r}; features: {', '.join(f.name for f in self.features)}")

    def phrase_tables(self) -> list[Feature]:
        return [f for f in self.features if f.type in PHRASE_TABLE_TYPES or f.type.startswith("PhraseDictionary")]

    def _weight_line(self, name: str) -> int | None:
        span = self.section("weight")
        if span is None:
            return None
        for i in range(span[0] + 1, span[1]):
            s = self._content(self.lines[i])
            if s and s.split("=", 1)[0].strip() == name and "=" in s:
                return i
        return None

    def _weight_section(self) -> tuple[int, int]:
        """(header index, end exclusive) of the one [weight] section."""
        spans = [(i, end) for sec, i, end in self._sections() if sec == "weight"]
        if len(spans) != 1:
            raise IniError(f"{self.path}: expected one [weight] section, found {len(spans)}")
        return spans[0]

    def weight_names(self) -> list[str]:
        """The names the [weight] section gives weights to, in file order."""
        start, end = self._weight_section()
        contents = (self._content(line) for line in self.lines[start + 1 : end])
        return [s.split("=", 1)[0].strip() for s in contents if "=" in s]

    def weights(self, name: str) -> list[float] | None:
        i = self._weight_line(name)
        if i is None:
            return None
        try:
            return [float(w) for w in self.lines[i].split("=", 1)[1].split()]
        except ValueError:
            raise IniError(f"[weight] line of {name} holds a weight that is not a number: {self.lines[i]!r}") from None

    # ---- edits -----------------------------------------------------------
    def set_weights(self, name: str, weights: list[float]) -> None:
        """Give feature `name`'s [weight] line these values, one per score it has: the same count
        as its line holds today (a feature without a line, or a different count, is refused)."""
        self.feature(name)  # refuses a name the file does not declare
        old = self.weights(name)
        if old is None:
            raise IniError(f"{self.path} has no [weight] line for {name}")
        if len(weights) != len(old):
            raise IniError(f"{name} has {len(old)} weight(s) in {self.path}, {len(weights)} given")
        self._set_weights(name, weights)

    def _set_weights(self, name: str, weights: list[float]) -> None:
        _check_finite(name, weights)
        line = f"{name}= " + " ".join(_fmt(w) for w in weights)
        i = self._weight_line(name)
        if i is not None:
            self.lines[i] = line
            return
        span = self.section("weight")
        if span is None:
            if self.lines and self.lines[-1].strip():
                self.lines.append("")
            self.lines += ["[weight]", line]
            return
        self.lines.insert(self._last_content(span) + 1, line)

    def _last_content(self, span: tuple[int, int]) -> int:
        """Index of the last non-blank line of a section (its header if it is empty)."""
        last = span[0]
        for i in range(span[0] + 1, span[1]):
            if self.lines[i].strip():
                last = i
        return last

    def copy_weights(self, other: "MosesIni") -> None:
        """Put `other`'s [weight] section, line for line, in place of this one's (a tuned model's
        weights into a filtered copy of it). Both must weight the same features, else `other` is
        the model of another system."""
        start, end = self._weight_section()
        other_start, other_end = other._weight_section()
        if sorted(self.weight_names()) != sorted(other.weight_names()):
            raise IniError(f"{other.path} weights features {other.weight_names()}, {self.path} has "
                           f"{self.weight_names()}")
        self.lines[start + 1 : end] = other.lines[other_start + 1 : other_end]

    def add_columns(self, table: str | None, count: int, weight: float | list[float] = COLUMN_WEIGHT,
                    path: str | None = None, fixed: bool = False, check_table: bool = True) -> Feature:
        """Declare `count` more score columns on phrase table `table` (a feature name).

        `table` may be None when the file has exactly one phrase table. The
        new columns get `weight` (one value for all, or one per column);
        `path` replaces the table's path=; `fixed` marks the new columns
        untuneable (tuneable-components=), so MERT leaves their weights as given.

        Without `path`, the table keeps its file, which must then already have
        the new columns (Moses refuses a num-features that differs from the
        table's): its first line is read and the edit refused unless it has
        exactly the new num-features scores. `check_table=False` skips that
        (a table this process cannot read, e.g. a binary one).
        """
        if count < 1:
            raise IniError("--count must be at least 1")
        if table is None:
            tables = self.phrase_tables()
            if len(tables) != 1:
                raise IniError(f"{len(tables)} phrase tables here ({', '.join(t.name for t in tables)}): name one")
            feat = tables[0]
        else:
            feat = self.feature(table)
        old = feat.num_scores()
        if old is None:
            raise IniError(f"feature {feat.name} has no num-features=")
        new_weights = _expand(weight, count)
        weights = self.weights(feat.name)
        if weights is None:
            raise IniError(f"feature {feat.name} has no line in [weight]")
        if len(weights) != old:
            raise IniError(f"feature {feat.name}: num-features={old} but {len(weights)} weights")
        _check_finite(feat.name, weights + new_weights)
        if path is None and check_table:
            has = feat.table_columns()
            if has != old + count:
                raise IniError(f"{feat.name}'s table {feat.table_file()} has {has} scores a line, not the "
                               f"{old + count} of num-features={old}+{count}: give the scored table with --path "
                               "(or --table-has-columns to skip this check)")
        feat.set("num-features", str(old + count))
        if path is not None:
            feat.set("path", path)
        comps = feat.get("tuneable-components")
        if fixed or comps is not None:
            prev = comps.split(",") if comps else ["true"] * old
            feat.set("tuneable-components", ",".join(prev + [("false" if fixed else "true")] * count))
        self.lines[feat.index] = feat.render()
        self._set_weights(feat.name, weights + new_weights)
        return feat

    def add_feature(self, line: str, weights: list[float] | None = None) -> Feature:
        """Append a feature line to [feature] and its weights to [weight].

        The name is the line's name= or Moses' default (Type + index) and must
        be new and usable by MERT. Without `weights`, each score gets 0.1.
        """
        tokens = line.split()
        if not tokens:
            raise IniError("empty feature line")
        span = self.section("feature")
        if span is None:
            if self.lines and self.lines[-1].strip():
                self.lines.append("")
            self.lines.append("[feature]")
            span = self.section("feature")
        pos = self._last_content(span) + 1
        self.lines.insert(pos, " ".join(tokens))
        old_lines = list(self.lines)
        try:
            self._index("moses.ini")
            feat = next(f for f in self.features if f.index == pos)
            check_name(feat.name)
            n = feat.num_scores()
            if weights is None:
                if n is None:
                    raise IniError(f"{feat.type}: give num-features= or the weights")
                weights = [0.1] * n
            if n is not None and len(weights) != n:
                raise IniError(f"feature {feat.name} has {n} scores but {len(weights)} weights were given")
            if n is None:
                feat.set("num-features", str(len(weights)))
                self.lines[pos] = feat.render()
            if self._weight_line(feat.name) is not None:
                raise IniError(f"[weight] already has a line for {feat.name}")
            self._set_weights(feat.name, list(weights))
        except Exception:
            self.lines = old_lines
            del self.lines[pos]
            self._index("moses.ini")
            raise
        self._index("moses.ini")
        return self.feature(feat.name)

    def remove_feature(self, name: str) -> None:
        """Drop a feature line and its weight line."""
        feat = self.feature(name)
        w = self._weight_line(name)
        for i in sorted([feat.index] + ([w] if w is not None else []), reverse=True):
            del self.lines[i]
        self._index("moses.ini")

    def set_param(self, name: str, key: str, value: str) -> None:
        """Set key=value on a feature line (e.g. a path)."""
        feat = self.feature(name)
        if key == "name":
            raise IniError("renaming is not supported")
        feat.set(key, value)
        self.lines[feat.index] = feat.render()
        self._index("moses.ini")


def _check_finite(name: str, weights: list[float]) -> None:
    if not all(math.isfinite(w) for w in weights):
        raise IniError(f"weights of {name} must be finite numbers, got {weights}")


def _fmt(w: float) -> str:
    return repr(float(w)) if float(w) != int(w) else str(int(w)) if abs(w) < 1e15 else repr(float(w))


def _expand(weight: float | list[float], count: int) -> list[float]:
    if isinstance(weight, (int, float)):
        return [float(weight)] * count
    weight = [float(w) for w in weight]
    if len(weight) == 1:
        return weight * count
    if len(weight) != count:
        raise IniError(f"{len(weight)} weights given for {count} columns")
    return weight
