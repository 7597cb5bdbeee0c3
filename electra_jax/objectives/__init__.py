"""The pre-training objectives, one module per family over a shared core.

core.py         masking, sampling, replacing, the MLM and replaced-token losses (pure
                functions on arrays); `Objective`, what an objective gives the step
electra.py      ELECTRA (with the discriminator's optional MLM term)
ablations.py    the paper's ablations that keep the generator: electra_15, replaced_mlm,
                all_tokens_mlm
mlm.py          BERT's masked language model
two_stage.py    Two-Stage ELECTRA: the generator, then the discriminator from it
adversarial.py  Adversarial ELECTRA: the generator trained by the policy gradient
registry.py     objective name -> its `Objective`
catalog.py      the names, without jax (validate.py reads them)
"""
