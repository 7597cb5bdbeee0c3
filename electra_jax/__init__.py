"""electra_jax: ELECTRA pre-training (replaced token detection) in JAX/Flax.

    import electra_jax
    model = electra_jax.load("runs/tiny")  # a workdir (newest checkpoint), an export, or hf:DIR

`import electra_jax` stays light: jax, flax and orbax are imported by `load`, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from electra_jax.pretrained import Model

__all__ = ["load"]


def load(path: str) -> Model:
    """A pre-trained ELECTRA, compiled for inference: see `electra_jax.pretrained.Model`.

    `path` is a pre-training workdir (its newest checkpoint), an export dir from
    `python -m electra_jax.export`, or "hf:DIR" for transformers ELECTRA folders.
    """
    from electra_jax.pretrained import load as _load

    return _load(path)
