"""Hugging Face transformers interop, one module per concern.

    names.py            what things are called: files, networks, every parameter (and the
                        conversions between our tree and transformers' state dicts)
    config.py           transformers' ElectraConfig from a spec, and a spec from one
    tokenizer_files.py  tokenizer.json from our SentencePiece model; reading an export's tokenizer
    read.py             import: an export, a transformers pair or folder -> `weights.Pretrained`
    write.py            export: a `Pretrained` -> discriminator/, generator/ and export.json

The command is `python -m electra_jax.export`; `electra_jax.load("hf:DIR")` imports.
"""
