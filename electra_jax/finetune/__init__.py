"""Fine-tuning on GLUE: tasks (TSV and TFDS readers), features, the classifier head, metrics,
and the loop. Run it as `python -m electra_jax.finetune --config=configs/glue.py ...`.

Submodules are imported by their users, so that `import electra_jax.finetune.tasks` does not
pull in JAX.
"""
