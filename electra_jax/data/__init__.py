"""Data path of electra_jax: corpus sources, SentencePiece tokenizer, ELECTRA packing, cached
ArrayRecord shards and the Grain input pipeline.

Submodules are imported lazily by their users (``from electra_jax.data import prepare``) so that
importing this package stays cheap; only what its tokenizers share lives here: the error type
and the special pieces.
"""

from electra_jax.errors import DataError

# Ids 0-4 of every SentencePiece model this package trains, and the names BERT's WordPiece
# vocabularies give the same tokens.
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

__all__ = ["SPECIAL_PIECES", "DataError"]
