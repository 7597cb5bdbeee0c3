"""Data path of electra_jax: corpus sources, SentencePiece tokenizer, ELECTRA packing, cached
ArrayRecord shards and the Grain input pipeline.

Submodules are imported lazily by their users (``from electra_jax.data import prepare``) so that
importing this package stays cheap; only what its tokenizers share lives here: the error type
and the special pieces.
"""


class DataError(ValueError):
    """Bad data input (a source, a tokenizer file, a config value) that the user must fix.

    The message is one self-contained line: it names the file or source and says what to do, so
    the command-line entry point can print it without a traceback.
    """


# Ids 0-4 of every SentencePiece model this package trains, and the names BERT's WordPiece
# vocabularies give the same tokens.
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

__all__ = ["SPECIAL_PIECES", "DataError"]
