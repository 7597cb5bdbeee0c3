"""BERT's WordPiece tokenizer (a vocab.txt), for runs built on Google's released ELECTRA models.

Those checkpoints come with a BERT vocabulary, not a SentencePiece model. A run continued from
one (train.init_from) keeps the vocab.txt in its tokenizer folder, and `tokenizer.load_saved`
returns this class there: it has `tokenizer.Tokenizer`'s interface, so packing, fine-tuning and
export treat both alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from electra_jax.data import SPECIAL_PIECES
from electra_jax.errors import DataError
from electra_jax.store import filenames, jsonio, paths

VOCAB_FILENAME = "vocab.txt"

_BERT_OPTIONS = {
    "do_lower_case": (True, False),
    "strip_accents": (None, True, False),
    "tokenize_chinese_chars": (True, False),
}


class WordPieceTokenizer:
    """BERT's WordPiece (vocab.txt), with `data.tokenizer.Tokenizer`'s interface.

    For checkpoints such as Google's released ELECTRA models ([PAD] 0, [UNK] 100, [CLS] 101,
    [SEP] 102, [MASK] 103 in their uncased vocab). Backed by the `tokenizers` library's BERT
    normalizer, pre-tokenizer and WordPiece model, configured from tokenizer_config.json
    (do_lower_case, strip_accents, tokenize_chinese_chars) as transformers' BertTokenizer is, so
    the ids are those transformers gives; as there, special tokens typed in text are matched.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_path: str = "",
    ):
        # tokenizers: only on the path that uses it (an optional extra, or slow to import).
        from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        self._vocab = list(vocab)
        self._model_path = model_path
        self.bert_options = {
            "do_lower_case": bool(do_lower_case),
            "strip_accents": strip_accents,
            "tokenize_chinese_chars": bool(tokenize_chinese_chars),
        }
        self._ids: dict[str, int] = {}
        for i, piece in enumerate(self._vocab):
            self._ids.setdefault(piece, i)  # a duplicated line keeps its first id, as BERT's
        missing = [p for p in SPECIAL_PIECES if p not in self._ids]
        if missing:
            raise DataError(
                f"{model_path or 'vocab'} lacks the special token(s) {missing}; a BERT vocab.txt "
                f"has {list(SPECIAL_PIECES)}"
            )
        self._pad, self._unk, self._cls, self._sep, self._mask = (
            self._ids[p] for p in SPECIAL_PIECES
        )
        hf = HFTokenizer(
            models.WordPiece(self._ids, unk_token="[UNK]", max_input_chars_per_word=100)
        )
        hf.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=bool(tokenize_chinese_chars),
            strip_accents=strip_accents,
            lowercase=bool(do_lower_case),
        )
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece(prefix="##")
        hf.add_special_tokens([AddedToken(p, special=True) for p in SPECIAL_PIECES])
        self._hf = hf
        digest = hashlib.sha256("\n".join(self._vocab).encode("utf-8"))
        digest.update(json.dumps(self.bert_options, sort_keys=True).encode("utf-8"))
        self._fingerprint = digest.hexdigest()

    @classmethod
    def load(cls, folder: str) -> WordPieceTokenizer:
        """From folder/vocab.txt and (if present) folder/tokenizer_config.json."""
        path = paths.join(folder, VOCAB_FILENAME)
        try:
            # Lines as a text-mode file reads them (\r\n and \r are line ends too).
            text = paths.read_text(path).replace("\r\n", "\n").replace("\r", "\n")
            vocab = text.split("\n")
            if vocab[-1] == "":
                vocab.pop()
        except OSError as e:
            raise DataError(f"{path} cannot be read ({e})") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{path} cannot be read ({jsonio.text_problem(e)})") from None
        config_path = paths.join(folder, filenames.HF_TOKENIZER_CONFIG_FILE)
        options = jsonio.read_json_object(
            config_path, "a tokenizer_config.json is an object of options", DataError, default={}
        )
        for name, allowed in _BERT_OPTIONS.items():
            if name in options and not any(options[name] is v for v in allowed):
                raise DataError(
                    f"{config_path}: {name} is {jsonio.one_line(repr(options[name]), 60)}; it "
                    f"must be one of {' or '.join(map(json.dumps, allowed))}: correct the file"
                )
        return cls(
            vocab,
            do_lower_case=options.get("do_lower_case", True),
            strip_accents=options.get("strip_accents"),
            tokenize_chinese_chars=options.get("tokenize_chinese_chars", True),
            model_path=path,
        )

    def __getstate__(self) -> dict:
        return {"vocab": self._vocab, "model_path": self._model_path, **self.bert_options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def model_path(self) -> str:
        return self._model_path

    @property
    def fingerprint(self) -> str:
        """Hex sha256 of the vocab and the normalization options."""
        return self._fingerprint

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def unk_id(self) -> int:
        return self._unk

    @property
    def cls_id(self) -> int:
        return self._cls

    @property
    def sep_id(self) -> int:
        return self._sep

    @property
    def mask_id(self) -> int:
        return self._mask

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, no special tokens added: ``[num_tokens]``."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Token ids of many texts (`tokenizers` parallelises; num_threads is not used)."""
        del num_threads
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_batch_with_offsets(
        self, texts: Sequence[str]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Per text: its token ids ``[num_tokens]`` (those of `encode`) and each token's
        (begin, end) character span in the text as given, before lower-casing and accent
        stripping: ``text[begin:end]`` is what the token was made from. For SQuAD's answers."""
        encodings = self._hf.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, [tuple(o) for o in e.offsets]) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; special tokens decode to nothing."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, out_dir: str) -> None:
        """Writes out_dir/tokenizer_config.json, then out_dir/vocab.txt (what `load` reads), each
        under a temporary name renamed into place: vocab.txt, whose presence makes the folder a
        run's tokenizer (`tokenizer.has_saved`), is never seen half written."""
        paths.makedirs(out_dir)
        config = {"tokenizer_class": "BertTokenizer", **self.bert_options}
        jsonio.write_json(paths.join(out_dir, filenames.HF_TOKENIZER_CONFIG_FILE), config)
        paths.write_atomic(
            paths.join(out_dir, VOCAB_FILENAME), "".join(f"{p}\n" for p in self._vocab)
        )

    def id_to_piece(self, token_id: int) -> str:
        return self._vocab[int(token_id)]

    def piece_to_id(self, piece: str) -> int:
        return self._ids.get(piece, self._unk)
