"""electra_jax: ELECTRA pre-training (replaced token detection) in JAX/Flax.

    import electra_jax
    model = electra_jax.load("runs/tiny")  # a workdir (newest checkpoint), an export, or hf:DIR
    classifier = electra_jax.load("runs/tiny-sst2")  # a fine-tuning workdir: predict(texts)

`import electra_jax` stays light: jax, flax and orbax are imported by `load`, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from electra_jax.finetune.predictor import QuestionAnswerer, TextClassifier
    from electra_jax.pretrained import Model

__all__ = ["load"]


def load(path: str) -> Model | TextClassifier | QuestionAnswerer:
    """A model from `path`, compiled for inference.

    A pre-training workdir (its newest checkpoint), an export dir from `python -m
    electra_jax.export`, or "hf:DIR" for transformers ELECTRA folders give a
    `electra_jax.pretrained.Model` (tokenize, replaced-token logits, hidden states). A fine-tuning
    workdir gives its fine-tuned model: `finetune.predictor.TextClassifier` (GLUE: `predict(texts
    or pairs)` -> labels and probabilities, or STS-B scores) or `QuestionAnswerer` (SQuAD:
    `answer(question, context)` -> spans with scores).
    """
    # Imported by load only: `import electra_jax` stays without jax (tests/conftest.py).
    from electra_jax.finetune.predictor import is_finetuned

    if is_finetuned(path):
        # Imported by load only: `import electra_jax` stays without jax (tests/conftest.py).
        from electra_jax.finetune.predictor import load as load_finetuned

        return load_finetuned(path)
    # Imported by load only: `import electra_jax` stays without jax (tests/conftest.py).
    from electra_jax.pretrained import load as _load

    return _load(path)
