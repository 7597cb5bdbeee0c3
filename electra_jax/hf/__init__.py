"""Hugging Face transformers interop, one module per concern.

    names.py            what things are called: files, networks, every parameter (and the
                        conversions between our tree and transformers' state dicts)
    electra_config.py   transformers' ElectraConfig from a spec, and a spec from one
    tokenizer_files.py  tokenizer.json from our SentencePiece model; reading an export's tokenizer
    read.py             import: an export, a transformers pair or folder -> `weights.Pretrained`
    write.py            export: a `Pretrained` -> discriminator/, generator/ and export.json
    task_heads.py       fine-tuned heads in transformers' layout (sequence classification, QA)
    card.py, hub.py     model cards, and the upload to the Hugging Face Hub

The command is `python -m electra_jax.export`; `electra_jax.load("hf:DIR")` imports.
"""
