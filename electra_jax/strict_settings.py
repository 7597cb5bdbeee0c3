"""No setting is silently dropped or silently replaced: what every command's flags and config
file go through besides their own checks (cli.parse_flags and cli.command_config call these).

- A flag given twice (`--config.train.batch_size=8 ... --config.train.batch_size=16`, or
  `--workdir=a --workdir b`) is refused: absl takes the later value without a word. Flags that
  take repeats by design (absl's multi flags) are left alone.
- Every key a config file sets is checked as strictly as an override: one the command's schema
  does not declare (`config.train.num_step = 3`, which left train.num_steps at its default) is
  named, with the closest declared key (cli.unknown_keys, an unknown override's did-you-mean).

Imports nothing of the package at module level (cli imports it at its top).
"""

from __future__ import annotations


def repeated_flag(argv: list[str], flag_values) -> str | None:
    """The first flag that `argv` (a command line, program name first) gives twice, in either
    of absl's forms (--name=VALUE, --name VALUE; a boolean's --name / --noname), as
    '--name (as A and B)'; None when each is given once. `flag_values`: absl's FLAGS, for which
    names are booleans or multi flags."""
    seen: dict[str, str] = {}
    for arg in argv[1:]:
        if arg == "--":
            break
        if not arg.startswith("--") or len(arg) == 2:
            continue
        name = arg[2:].split("=", 1)[0]
        flag = _flag(flag_values, name)
        if flag is None and name.startswith("no"):
            negated = _flag(flag_values, name[2:])
            if negated is not None and negated.boolean:
                name, flag = name[2:], negated
        if flag is not None and _is_multi(flag):
            continue
        if name in seen:
            return f"--{name} (as {seen[name]} and {arg})"
        seen[name] = arg
    return None


def _flag(flag_values, name: str):
    try:
        return flag_values[name]
    except KeyError:
        return None


def _is_multi(flag) -> bool:
    from absl import flags

    return isinstance(flag, flags.MultiFlag)


def config_keys(config, prefix: str = "") -> list[str]:
    """Every dotted key of a ConfigDict, sections included ('train', 'train.num_steps')."""
    import ml_collections

    keys = []
    for name, value in config.items():
        keys.append(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys.extend(config_keys(value, f"{prefix}{name}."))
    return keys


def file_keys(config, finetuning: bool):
    """(the command's declared config, at its defaults; the keys the config file set that are
    not inside a section the schema lacks): what cli.unknown_keys, an override's check, then
    checks, so that a file's key is held as an override is. A fine-tuning config is checked
    against every family's keys; one of no known family is left to its own check
    (finetune/checks.py names the family): (an empty config, [])."""
    import ml_collections

    from electra_jax.config import finetune_keys, pretrain_keys, schema

    if finetuning:
        if config.get("family") not in finetune_keys.TABLES:
            return ml_collections.ConfigDict(), []
        # Every family's keys: a key of another family (a config whose family was switched by
        # an override) is no misspelling; finetune/checks.py names what the switch lacks.
        tables = finetune_keys.TABLES.values()
        declared = schema.defaults(list({k.name: k for t in tables for k in t}.values()))
    else:
        declared = schema.defaults(pretrain_keys.KEYS)
    known = set(config_keys(declared))
    # A key inside an unknown section is named by its section alone.
    return declared, [k for k in config_keys(config) if k.rpartition(".")[0] in known | {""}]
