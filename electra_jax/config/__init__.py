"""The config schema: every key of pre-training and fine-tuning declared once (schema.py's `Key`:
type, default, doc, range or choices, resume rule, meaning when absent), in pretrain_keys.py and
finetune_keys.py, and `--print_config` (describe.py). At the bottom of the import graph: nothing
here imports the rest of electra_jax, nor jax.
"""
