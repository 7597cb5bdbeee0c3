"""The export command: a pre-training run as a Hugging Face transformers ELECTRA pair.

    python -m electra_jax.export --workdir=runs/tiny --out=runs/tiny/hf

Writes OUT/discriminator (ElectraForPreTraining), OUT/generator (ElectraForMaskedLM) and
OUT/export.json from the workdir's newest checkpoint; see `electra_jax.hf.write` for the layout
and how a previous export is replaced.
"""

from __future__ import annotations

import logging
import os

from electra_jax import paths
from electra_jax.hf.write import check_out, write_export
from electra_jax.pretrained import load_workdir
from electra_jax.weights import PretrainedError


def export(workdir: str, out: str) -> dict:
    """A workdir's newest checkpoint -> OUT (see write_export); returns the manifest."""
    if paths.is_remote(out):
        # The export's files are written with its own checks against links and foreign files,
        # which need a filesystem; a bucket gets the finished folder by a copy.
        raise PretrainedError(
            f"--out {out} is a URI; give a local folder and copy it to the bucket afterwards "
            "(gcloud storage cp -r OUT gs://...)"
        )
    check_out(os.path.abspath(out))  # before the restore, so a bad --out fails at once
    if not paths.isdir(workdir):
        raise PretrainedError(f"--workdir {workdir} does not exist; give a pre-training workdir")
    return write_export(load_workdir(workdir), out)


def _define_flags():
    # Defined only when run as a program, so that importing this module never clashes with the
    # flags of the train or finetune commands.
    from absl import flags

    flags.DEFINE_string("workdir", None, "The pre-training workdir to export (newest checkpoint).")
    flags.DEFINE_string("out", None, "Where discriminator/ and generator/ go (default WORKDIR/hf).")
    flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv) -> None:
    from absl import flags

    from electra_jax.cli import fail

    values = flags.FLAGS
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; use --workdir=... --out=...")
    if not values.workdir:
        fail("--workdir is required: the pre-training run to export, e.g. --workdir=runs/tiny")
    if not values.verbose:
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if not values.out and paths.is_remote(values.workdir):
        fail(
            f"--out is required with a gs:// --workdir: the export is written to a local folder "
            f"(e.g. --out=runs/{values.workdir.rstrip('/').rsplit('/', 1)[-1]}-hf)"
        )
    out = values.out or os.path.join(values.workdir, "hf")
    try:
        manifest = export(values.workdir, out)
    except PretrainedError as e:
        if values.verbose:
            raise
        fail(str(e))
    print(
        f"exported {manifest['source']} to {os.path.abspath(out)}: discriminator "
        f"{manifest['discriminator_params']:,} params, generator "
        f"{manifest['generator_params']:,} params"
    )


def cli() -> None:
    from absl import app

    from electra_jax.cli import parse_flags

    _define_flags()
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    cli()
