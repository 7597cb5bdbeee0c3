"""A weighted mixture of corpora (`data.mixture`): its spec, and which part each row comes from.

    data.mixture = 'SOURCE:WEIGHT;SOURCE:WEIGHT[;...]'  e.g. 'builtin:0.7;text:/books/*.txt:0.3'

Each SOURCE is a `data.source` form (sources.py), optionally named, `NAME=SOURCE:WEIGHT`; the
weight follows the last ':' (so a column or a TFDS split stays with its source). At least two
parts, each source once, each weight a positive number (only their ratios count). A part's
name (by default one made from its source: 'builtin', a TFDS name, a glob's last plain folder or
file) names its held-out readings in metrics.jsonl (`eval/NAME/disc_auc`).

The blend's order is a pure function of the row's index in the blended stream: row k is row j
of part i's own stream (its training rows shuffled from the seed, a new order each epoch, as a
single corpus's), (i, j) = `locate(k, proportions)`. Part 0 holds ceil(m * p0 / T) of the first
m rows and the others share the rest the same way, part by part: every stretch of the stream
holds each part's share to within a row or two, without a draw to keep. So the global batch of
a step is the same rows for any number of processes, and a resume at a step reads what the
uninterrupted run read there, as for one corpus (pipeline.py).

Imports no jax and no grain: validate.py parses the spec before any work.
"""

from __future__ import annotations

import dataclasses
import math
import re

import ml_collections

from electra_jax.config import pretrain_keys, schema
from electra_jax.data import sources
from electra_jax.errors import ConfigError, DataError

# Weights become whole proportions of this many: a part below a millionth of the total would
# get no row in a million, which is no part of the blend.
RESOLUTION = 10**6
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)=(.*)", re.DOTALL)
_GLOB_CHARS = re.compile(r"[*?\[]")
_DEFAULT_SOURCE = schema.by_name(pretrain_keys.KEYS)["data.source"].default


@dataclasses.dataclass(frozen=True)
class Part:
    """One corpus of a mixture: its name, its data.source form and its weight."""

    name: str
    source: str
    weight: float


@dataclasses.dataclass(frozen=True)
class Mixture:
    """The parts of data.mixture, in the spec's order."""

    parts: tuple[Part, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    @property
    def shares(self) -> tuple[float, ...]:
        """Each part's weight over the weights' sum."""
        total = math.fsum(p.weight for p in self.parts)
        return tuple(p.weight / total for p in self.parts)

    @property
    def proportions(self) -> tuple[int, ...]:
        """The shares as whole numbers (of about RESOLUTION), each >= 1 (`parse` checks): what
        `locate` divides by, exactly."""
        return tuple(round(share * RESOLUTION) for share in self.shares)


def _fail(message: str) -> None:
    raise ConfigError(f"data.mixture: {message}")


def _default_name(source: sources.Source) -> str:
    """A short name from a source: 'builtin'; a TFDS dataset's name ('wikipedia_20230601.en');
    a glob's last part without wildcards, a file's up to its first dot ('text:/d/wiki/**/*.txt'
    -> 'wiki', 'jsonl:c4/en.jsonl.gz' -> 'en'); characters a metrics key should not hold
    become '_'."""
    if source.kind == "builtin":
        name = "builtin"
    elif source.kind == "tfds":
        name = source.arg.split(":", 1)[0]
    else:
        pattern = source.pattern.split("://", 1)[-1]
        plain = [c for c in pattern.split("/") if c and not _GLOB_CHARS.search(c)]
        last = pattern.rstrip("/").rsplit("/", 1)[-1]
        name = plain[-1] if plain else source.kind
        if plain and name == last:  # a file named whole: its name without the extensions
            name = name.split(".", 1)[0] or name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def parse(text: str) -> Mixture:
    """data.mixture as a Mixture.

    Raises:
      ConfigError: one line naming what is wrong: a part without a weight or with a weight that
        is not a positive number (or below a millionth of the total), a source that is not a
        data.source form, fewer than two parts, a source or a name given twice.
    """
    entries = [e.strip() for e in str(text).split(";") if e.strip()]
    parts: list[Part] = []
    for entry in entries:
        named = _NAMED.fullmatch(entry)
        name, spec = (named.group(1), named.group(2).strip()) if named else ("", entry)
        source_text, colon, weight_text = spec.rpartition(":")
        if not colon or not source_text.strip():
            _fail(f"'{entry}' has no weight; write SOURCE:WEIGHT, e.g. builtin:0.7")
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            _fail(f"the weight of '{entry}' is {weight_text.strip()!r}; use a number > 0")
        try:
            source = sources.parse(source_text.strip())
        except DataError as e:
            _fail(str(e))
        parts.append(Part(name or _default_name(source), source.name, weight))
    if len(parts) < 2:
        _fail(
            f"{text!r} names {len(parts)} source(s); a mixture blends two or more (e.g. "
            "'builtin:0.7;text:/data/books/*.txt:0.3'); for one corpus set data.source instead"
        )
    for what, values in (("source", [p.source for p in parts]), ("name", [p.name for p in parts])):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            advice = (
                "give each source once, with its whole weight"
                if what == "source"
                else "name the parts apart: NAME=SOURCE:WEIGHT (letters, digits, _ . -)"
            )
            _fail(f"the {what} '{twice[0]}' is given twice; {advice}")
    mixture = Mixture(tuple(parts))
    for part, proportion in zip(parts, mixture.proportions, strict=True):
        if proportion < 1:
            _fail(
                f"the weight of {part.source} ({part.weight:g}) is below a millionth of the "
                "weights' sum: it would give no row; raise it or leave the source out"
            )
    return mixture


def check(data_cfg) -> None:
    """ConfigError when data.mixture is set but not a mixture `parse` reads, or set beside a
    data.source other than its default (the corpus named twice)."""
    text = str(data_cfg.get("mixture", "") or "")
    if not text:
        return
    if data_cfg.source != _DEFAULT_SOURCE:
        raise ConfigError(
            f"data.mixture={text!r} and data.source={data_cfg.source!r} both name the corpus; "
            f"give one: data.mixture for several sources by weight (data.source left at "
            f"{_DEFAULT_SOURCE!r}), data.source for one"
        )
    parse(text)


def of_config(data_cfg) -> Mixture | None:
    """The data section's mixture, or None when it reads data.source alone (a section of a
    caller's making may lack the key: no mixture)."""
    text = str(data_cfg.get("mixture", "") or "") if "mixture" in data_cfg else ""
    return parse(text) if text else None


def part_config(data_cfg, part: Part) -> ml_collections.ConfigDict:
    """The data section as a run of `part`'s source alone would have it: what prepares, keys
    and reads that part (its shards are those a run of that source alone prepares)."""
    cfg = ml_collections.ConfigDict(data_cfg.to_dict())
    cfg.source = part.source
    if "mixture" in cfg:
        cfg.mixture = ""
    return cfg


def in_part(name: str, error: DataError) -> DataError:
    """`error`, met reading the part `name`, as one line that says it is data.mixture's part
    (its class kept but for sources.SourceAbsent: a mixture's parts have no stand-in shards)."""
    kind = DataError if isinstance(error, sources.SourceAbsent) else type(error)
    return kind(f"data.mixture part {name!r}: {error}")


def corpus_files(data_cfg) -> list[list] | None:
    """sources.Source.files of the corpus the data section names: for a mixture, its parts'
    local files together, sorted (None where no part has local files)."""
    mix = of_config(data_cfg)
    if mix is None:
        return sources.from_config(data_cfg).files()
    options = sources.SourceOptions.from_config(data_cfg)
    found = None
    for part in mix.parts:
        try:
            files = sources.parse(part.source, options).files()
        except DataError as e:
            raise in_part(part.name, e) from None
        if files is not None:
            found = (found or []) + files
    return None if found is None else sorted(found)


def locate(index: int, proportions: tuple[int, ...]) -> tuple[int, int]:
    """(part, row of that part's stream) of row `index` of the blended stream.

    Part 0 holds ceil(m * p0 / T) of the first m rows (T the proportions' sum), and the rows
    it leaves are the stream of the other parts, blended the same way, part by part. Integer
    arithmetic only, so every host finds the same answer for any index.
    """
    k, rest = int(index), sum(proportions)
    for i, p in enumerate(proportions[:-1]):
        others = rest - p
        # The other parts' rows among the first k rows, and among the first k + 1.
        before, through = k * others // rest, (k + 1) * others // rest
        if through == before:  # row k is part i's, its (k - before)-th
            return i, k - before
        k, rest = before, others
    return len(proportions) - 1, k


def counts(rows: int, proportions: tuple[int, ...]) -> tuple[int, ...]:
    """How many of the first `rows` rows of the blended stream each part holds."""
    out, m, rest = [], int(rows), sum(proportions)
    for p in proportions[:-1]:
        others = rest - p
        mine = m - m * others // rest
        out.append(mine)
        m, rest = m - mine, others
    return (*out, m)
