"""Fine-tuning on GLUE: tasks (TSV and TFDS readers), features, the classifier head, metrics,
and the loop. Run it as `python -m electra_jax.finetune --config=configs/glue.py ...`.

And on SQuAD 1.1 and 2.0 (the official JSON files): squad_data (questions and windows),
squad_heads (the span head and the answerability classifier), squad_eval (decoding, exact match
and F1) and squad_loop. Run it as `python -m electra_jax.finetune --config=configs/squad.py ...`.

Submodules are imported by their users, so that `import electra_jax.finetune.tasks` does not
pull in JAX.
"""
