"""Fine-tuning: one runner (loop.py: the model's start, the optimizer, the steps with their
finite checks and ETA, checkpoints and resuming, saving) under task families (family.py's
interface): glue.py (tasks, features, the classifier head, metrics) and squad.py (squad_data,
squad_heads, squad_eval), picked by `config.family`. saved.py is what a fine-tuning workdir
keeps; predictor.py loads it to predict (`electra_jax.load(FINETUNE_WORKDIR)`).

    python -m electra_jax.finetune --config=configs/glue.py ...
    python -m electra_jax.finetune --config=configs/squad.py ...

Submodules are imported by their users, so that `import electra_jax.finetune.tasks` does not
pull in JAX.
"""
