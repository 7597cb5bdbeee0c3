"""python -m electra_jax.prepare --config=configs/small.py --workdir=runs/small [--num_workers=N]

Prepares a run's data ahead of training: trains (or loads) the SentencePiece model into
``WORKDIR/tokenizer/`` (with ``train.init_from``, places the tokenizer of those weights there),
tokenizes and packs ``data.source`` on N worker processes (by default as many as the corpus's
size warrants on this host, as ``train`` does), and writes the ArrayRecord shards and
``manifest.json`` into ``data.cache_dir`` (default ``WORKDIR/data``), then prints the manifest's
figures as one JSON line; progress lines go to stderr. A ``data.mixture`` gets one tokenizer
trained on a sample of the blend by weight, and each source's shards in a folder of its own:
the JSON line's ``mixture`` lists each part's figures. ``train`` with the same config
and workdir finds the shards by their content key and starts training at once.

Multi-host runs: put the workdir (or ``data.cache_dir``) on storage every host mounts (NFS,
GCSFuse, ...), run this once on one machine, then start ``train`` on every host with the same
config and workdir: each finds the tokenizer and the shards by their content key, prepares
nothing, and reads only its own rows of every global batch. Bad input ends with one line on
stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags

from electra_jax import cli, validate
from electra_jax.data import mixture, shards
from electra_jax.pretraining import resume
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames

_COMMAND = cli.ConfigCommand.define(
    "electra_jax.prepare", "A get_config() file such as configs/tiny.py.", "configs/tiny.py", False
)
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (tokenizer/ and data/ go here).")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers",
    0,
    "Processes that tokenize; 0 chooses for this host and corpus as train does (one per 32 MB "
    "of input, at most one per core). The shards are identical for any number (the parent packs).",
)

# The manifest's figures, in the order they are printed.
_REPORTED = (
    "source",
    "tokenizer_fingerprint",
    "seq_length",
    "examples",
    "tokens",
    "tokens_read",
    "tokens_kept",
    "real_token_fraction",
    "single_segment_fraction",
    "short_fraction",
    "bytes_replaced",
    "files_skipped",
)


def run(config, workdir: str, num_workers: int | None) -> dict:
    """Prepares the tokenizer and shards of ``config`` for ``workdir`` on ``num_workers``
    tokenizing processes (None: chosen for this host, see ``shards.auto_num_workers``); returns
    a summary dict (the manifest's figures, the prepared directory, whether it was reused,
    seconds taken)."""
    t0 = time.time()
    # A new run will start from these weights: its data is tokenized with their tokenizer,
    # placed in the workdir as train places it (another one there is refused). A run with
    # checkpoints keeps its own, as train ignores init_from then.
    if config.train.init_from and not checkpoint_steps.has_checkpoints(workdir):
        resume.load_init_from(config, workdir)
    tokenizer = shards.ensure_tokenizer(
        config.data, os.path.join(workdir, filenames.TOKENIZER_DIR), config.seed
    )
    t_tok = time.time()
    cache_dir = config.data.cache_dir or os.path.join(workdir, filenames.DATA_DIR)
    mix = mixture.of_config(config.data)
    if mix is None:
        reused = _reused(config.data, tokenizer, cache_dir, config.seed)
        prepared = shards.prepare(
            config.data,
            tokenizer,
            cache_dir,
            config.seed,
            num_workers=num_workers,
            min_examples=int(config.train.batch_size),
        )
        summary = _figures(prepared, reused)
        packed = [] if reused else [prepared]
    else:
        reused_parts = [
            _reused(mixture.part_config(config.data, p), tokenizer, cache_dir, config.seed)
            for p in mix.parts
        ]
        blend = shards.prepare_mixture(
            config.data, tokenizer, cache_dir, config.seed, num_workers=num_workers
        )
        # Each part's figures, with its name and share of the blend's rows.
        summary = {
            "mixture": [
                {"name": p.name, "share": share, **_figures(prepared, reused)}
                for p, share, prepared, reused in zip(
                    mix.parts, mix.shares, blend.parts, reused_parts, strict=True
                )
            ]
        }
        packed = [p for p, reused in zip(blend.parts, reused_parts, strict=True) if not reused]
    t_end = time.time()
    summary["tokenizer_seconds"] = round(t_tok - t0, 2)
    summary["pack_seconds"] = round(t_end - t_tok, 2)
    if packed and t_end > t_tok:
        tokens = sum(p.manifest["tokens"] for p in packed)
        summary["tokens_per_second"] = round(tokens / (t_end - t_tok))
    return summary


def _reused(data_cfg, tokenizer, cache_dir: str, seed: int) -> bool:
    """Whether the prepared data of `data_cfg` is in `cache_dir` already."""
    key16 = shards.content_key(data_cfg, tokenizer, seed)[:16]
    return os.path.isfile(os.path.join(os.path.abspath(cache_dir), key16, shards.MANIFEST))


def _figures(prepared, reused: bool) -> dict:
    """The manifest's figures of one prepared corpus, its folder and whether it was reused."""
    figures = {k: prepared.manifest.get(k) for k in _REPORTED}
    return {**figures, "directory": prepared.directory, "reused": reused}


def main(argv) -> None:
    config = _COMMAND.start(argv, _WORKDIR, "the tokenizer and prepared data go there")
    if config is None:
        return
    if _NUM_WORKERS.value < 0:
        cli.fail(f"--num_workers={_NUM_WORKERS.value} must be 0 (chosen for this host) or more")

    def work() -> dict:
        validate.check_config(config)
        # The same lock as train's: a prepare and a train on one workdir would both write
        # tokenizer/ and data/.
        with workdir_lib.claimed(
            _WORKDIR.value, workdir_lib.PRETRAIN, command="electra_jax.prepare"
        ):
            return run(config, _WORKDIR.value, _NUM_WORKERS.value or None)

    summary = _COMMAND.run(
        work, "then run the same command: nothing half-written was kept", interrupted=_interrupted
    )
    print(json.dumps(summary))


def _interrupted() -> None:
    # Nothing is saved in the background here: an ordinary exit, after the unwinding that
    # removed what was half-written.
    print(
        "interrupted; nothing half-written was kept: run the same command to prepare again",
        file=sys.stderr,
    )
    sys.exit(130)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
