"""A config key declared once (`Key`), and the pure functions every reader asks over a table of
them: the defaults, a user's config completed with them, per-key checks, an older config.json
upgraded, and the rule a resume follows for a key.

A table is a tuple of Keys named 'key' or 'section.key' (one level of sections, as every config
of electra_jax has). Imports nothing of electra_jax but its errors, and no jax.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import ml_collections

from electra_jax.errors import ConfigError

# What a resume may do with a key (pre-training: pretraining/resume.py; fine-tuning:
# finetune/prior_run.py; both through run/rerun.py).
FREE = "free"  # changed silently: how long the run goes, where and how often files are written
ALLOW = "allow"  # changed only when --allow_change names it, and recorded in config_changes.jsonl
MODEL = "model"  # fixes the parameters' shapes or meaning: never (a new --workdir)
KEEP = "keep"  # fine-tuning: held to the run's first start (its --allow_change takes no such key)
RESUME_RULES = (FREE, ALLOW, MODEL, KEEP)

_DEFAULT = object()  # Key.absent's default: a stored config without the key meant the default


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key.

    name: 'key' or 'section.key'. default: its value in the shipped defaults; its Python type
    (bool, int, float or str) is the key's kind. doc: one line, what `--print_config` shows.
    rule: the values it may take, as a range ('> 0', '>= 1', '[0, 1)', '(0, 1]'; bounds may be
    written 2**32) or a tuple of choices; '' when a cross-key check holds it (`cross` says which).
    float32: (lowest, highest), both included, where float32 arithmetic on the device still
    means something, for values the range alone would let through; `why` says why (shown on a
    failure of either). resume: one of RESUME_RULES. absent: what a stored config.json without
    the key means (a run started before the key existed); by default the default. cross: the
    rule a cross-key check (validate.py, finetune/checks.py) holds it to, for the reader.
    below_one_in_float32: a rate that must stay below 1 once rounded to float32 (Adam's decay
    rates: one that rounds to 1 freezes its moment). allows: for a key a resume ALLOWs to
    change, what the change lets differ (fine-tuning's --allow_change lists it). families: for
    a command of several families (fine-tuning's GLUE and SQuAD), those that have the key; ()
    all. required: the families whose config must hold the key itself (another family's config
    given its name is not converted by filling them in). path: a path or URI the run reads or
    writes through the path layer (store/paths.py), whose form validate.py checks. memory: a
    setting that shapes the step's memory per device (train.remat='auto' chooses its policy
    again when one changes: pretraining/remat_auto.py).
    """

    name: str
    default: Any
    doc: str
    rule: str | tuple = ""
    float32: tuple[float, float] | None = None
    why: str = ""
    resume: str = ALLOW
    absent: Any = _DEFAULT
    cross: str = ""
    below_one_in_float32: bool = False
    allows: str = ""
    families: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    path: bool = False
    memory: bool = False

    def __post_init__(self):
        if self.resume not in RESUME_RULES:
            raise ValueError(f"{self.name}: resume={self.resume!r} is not one of {RESUME_RULES}")
        if isinstance(self.rule, str) and self.rule:
            _parse(self.rule)  # a typo in a table fails at import, not at a user's bad value

    @property
    def kind(self) -> type:
        """bool, int, float or str: the type of the default."""
        return type(self.default)

    @property
    def when_absent(self) -> Any:
        """What a stored config without this key meant."""
        return self.default if self.absent is _DEFAULT else self.absent


def table(*keys: Key) -> tuple[Key, ...]:
    """The keys as a table; ValueError for a name declared twice."""
    names = [k.name for k in keys]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"keys declared twice: {', '.join(twice)}")
    return tuple(keys)


def by_name(keys: Iterable[Key]) -> dict[str, Key]:
    return {k.name: k for k in keys}


def _set(config: ml_collections.ConfigDict, name: str, value: Any) -> None:
    section, _, field = name.rpartition(".")
    if section:
        if section not in config:
            config[section] = ml_collections.ConfigDict()
        config[section][field] = value
    else:
        config[field] = value


def _has(config: Any, name: str) -> bool:
    section, _, field = name.rpartition(".")
    node = config
    if section:
        if section not in node:
            return False
        node = node[section]
    return hasattr(node, "keys") and field in node


def _value(config: Any, name: str) -> Any:
    section, _, field = name.rpartition(".")
    return (config[section] if section else config)[field]


def defaults(keys: Sequence[Key]) -> ml_collections.ConfigDict:
    """A ConfigDict of every key at its default (a ConfigDict orders its keys by name; the
    table's order is --print_config's, config/describe.py)."""
    config = ml_collections.ConfigDict()
    for key in keys:
        _set(config, key.name, key.default)
    return config


def complete(config: ml_collections.ConfigDict, keys: Sequence[Key]) -> ml_collections.ConfigDict:
    """`config` with every key of `keys` it lacks at its default, so that every read is a plain
    attribute: `config` itself when it lacks none, else a completed copy (the caller's config is
    not changed). Values present are kept as they are."""
    missing = [k for k in keys if not _has(config, k.name)]
    if not missing:
        return config
    config = config.copy_and_resolve_references()
    with config.unlocked():
        for key in missing:
            _set(config, key.name, key.default)
    return config


def upgrade(stored: dict, keys: Sequence[Key], declared_only: bool = False) -> dict:
    """A stored run config (config.json as a nested dict) with every key it lacks filled in as
    Key.absent says the run had it (a run started before model.scan_layers holds its layers
    unrolled); a new nested dict, `stored` unchanged. `declared_only` fills only the keys
    declared with an `absent` of their own: those known to have been added since runs were
    stored, where any other missing key may be a damaged file (a resume's model check)."""
    out = json.loads(json.dumps(stored))
    for key in keys:
        if declared_only and key.absent is _DEFAULT:
            continue
        section, _, field = key.name.rpartition(".")
        node = out.setdefault(section, {}) if section else out
        if isinstance(node, dict):
            node.setdefault(field, key.when_absent)
    return out


def resume_rule(name: str, keys: Sequence[Key]) -> str:
    """What a resume may do with the dotted key `name` (RESUME_RULES). A key the table does not
    declare follows its section when every declared key there has one rule (a key of `log` is
    free), else ALLOW."""
    named = by_name(keys)
    if name in named:
        return named[name].resume
    section = name.rpartition(".")[0]
    rules = {k.resume for k in keys if section and k.name.rpartition(".")[0] == section}
    return rules.pop() if len(rules) == 1 else ALLOW


def free_on_resume(keys: Sequence[Key]) -> tuple[str, ...]:
    """The keys a resume may change without a word (Key.resume FREE), and as 'section.' each
    section whose declared keys all are: resume_rule's answer, as a table rerun.Rules reads."""
    sections = {k.name.rpartition(".")[0] for k in keys} - {""}
    whole = sorted(f"{s}." for s in sections if resume_rule(f"{s}.?", keys) == FREE)
    return tuple(k.name for k in keys if k.resume == FREE) + tuple(whole)


# ----------------------------------------------------------------------------------- the checks


def _bound(text: str) -> float:
    text = text.strip()
    if "**" in text:
        base, power = text.split("**")
        return float(base) ** float(power)
    return float(text)


def _parse(rule: str) -> tuple[float | None, float | None, bool, bool]:
    """(lowest, highest, lowest included, highest included) of a range rule."""
    if rule[0] in "([":
        low, high = rule[1:-1].split(",")
        return _bound(low), _bound(high), rule[0] == "[", rule[-1] == "]"
    op, limit = rule.split()
    if op not in (">", ">="):
        raise ValueError(f"range rule {rule!r}: use '> X', '>= X' or an interval")
    return _bound(limit), None, op == ">=", True


def in_range(value: float, rule: str) -> bool:
    low, high, low_in, high_in = _parse(rule)
    ok = value >= low if low_in else value > low
    return ok and (high is None or (value <= high if high_in else value < high))


def _num(x: float) -> str:
    """x short ('1e-09', '10') where that is exact, else in full ('0.999999999')."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind_ok(key: Key, value: Any) -> bool:
    if key.kind is bool:
        return isinstance(value, bool)
    if key.kind is int:  # 32.0 is a whole number too (a Python caller's arithmetic)
        return _is_number(value) and (isinstance(value, int) or float(value).is_integer())
    if key.kind is float:
        return _is_number(value)
    return isinstance(value, key.kind)


def choices_text(choices: Sequence) -> str:
    """ "'a' or 'b'" for two choices, "one of 'a', 'b', 'c'" for more."""
    shown = [repr(c) for c in choices]
    return " or ".join(shown) if len(shown) == 2 else f"one of {', '.join(shown)}"


_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string"}


def _type_message(key: Key, value: Any, where: str) -> str:
    if key.kind is bool:
        return f"{where}{key.name}={value!r} is not a choice; use True or False"
    return f"{where}{key.name}={value!r} must be {_KIND_NAMES[key.kind]}"


def check_values(config: Any, keys: Sequence[Key], prefix: str = "") -> None:
    """ConfigError (one line naming the key) for the first value of `config` that is not finite,
    not of its key's kind, outside its range or float32 range, or not one of its choices. Keys
    `config` lacks are not checked (`complete` fills them first). `prefix` is how the command's
    messages spell a key ('config.' for fine-tuning's top-level keys); the wording is the same."""
    present = [k for k in keys if _has(config, k.name)]
    for key in present:  # a NaN or Inf anywhere first: no range holds it
        value = _value(config, key.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{key.name}={value} must be a finite number")
    for key in present:
        value = _value(config, key.name)
        if not _kind_ok(key, value):
            if isinstance(key.rule, tuple) and key.kind is not bool:
                raise ConfigError(_choice_message(key, value, prefix))
            raise ConfigError(_type_message(key, value, prefix))
        if isinstance(key.rule, tuple):
            if value not in key.rule:
                raise ConfigError(_choice_message(key, value, prefix))
        elif key.rule and not in_range(value, key.rule):
            interval = "in " if key.rule[0] in "([" else ""
            raise ConfigError(f"{prefix}{key.name}={value} must be {interval}{key.rule}{_why(key)}")
        if key.float32 is not None:
            low, high = key.float32
            if not low <= value <= high:
                raise ConfigError(
                    f"{prefix}{key.name}={value} must be in [{_num(low)}, {_num(high)}]{_why(key)}"
                )
        if key.below_one_in_float32 and isinstance(value, float):
            _check_decay_rate(key, value, prefix)


def _why(key: Key) -> str:
    return f": {key.why}" if key.why else ""


def _choice_message(key: Key, value: Any, where: str) -> str:
    return f"{where}{key.name}={value!r} is not a choice; use {choices_text(key.rule)}"


def _check_decay_rate(key: Key, value: float, prefix: str) -> None:
    # With no bias correction a rate that rounds to 1 keeps the moment at 0 forever.
    if struct.unpack("f", struct.pack("f", value))[0] >= 1:
        raise ConfigError(
            f"{prefix}{key.name}={value} rounds to 1.0 in float32, which freezes Adam's moment "
            "at its start; use at most 0.9999999"
        )


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a.b": value} for a nested dict {"a": {"b": value}}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
