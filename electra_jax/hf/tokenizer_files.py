"""Tokenizer files of an export: what `transformers.AutoTokenizer` loads, and what import reads.

Each exported folder gets tokenizer.json (our SentencePiece unigram model rebuilt with the
`tokenizers` library, so that AutoTokenizer loads it without sentencepiece),
tokenizer_config.json, special_tokens_map.json, and spm.model, the original model, which import
reads back so that ids stay those of training. A run with a BERT vocabulary (Google's released
checkpoints) writes vocab.txt instead.
"""

from __future__ import annotations

import os
from typing import Any

from electra_jax.data import SPECIAL_PIECES
from electra_jax.data.tokenizer import MODEL_FILENAME, Tokenizer
from electra_jax.data.wordpiece import VOCAB_FILENAME, WordPieceTokenizer
from electra_jax.errors import DataError, PretrainedError
from electra_jax.store import filenames, jsonio

MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]


def sentencepiece_tokenizer_json(tokenizer: Tokenizer) -> str:
    """tokenizer.json (the `tokenizers` library's format) giving our SentencePiece model's ids.

    The unigram model takes the pieces and scores as they are; the normalizer replays
    SentencePiece's: its precompiled character map (NFKC and friends), then, as
    remove_extra_whitespaces does, leading/trailing spaces dropped and runs of spaces collapsed
    (spaces only: a regex, not a strip, which would also eat U+0085 and similar that
    SentencePiece keeps as unknown characters). Metaspace adds the leading "▁" (add_dummy_prefix)
    and splits words at spaces. The post-processor writes [CLS] A [SEP] B [SEP] with type ids
    0 then 1, as our packing does.

    Differences (found by comparing on random text): a combining mark that follows whitespace
    or a character the map rewrites (e.g. "ﬁ" + U+0301) is dropped by `tokenizers` and kept by
    SentencePiece; the special pieces typed literally in text ("[MASK]") become the special ids in
    transformers (its convention, which fill-mask needs) but ordinary characters in ours.
    """
    # sentencepiece, tokenizers: only on the path that uses them (slow to import).
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import (
        AddedToken,
        Regex,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers import Tokenizer as HFTokenizer

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.model_proto)
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    where = tokenizer.model_path
    if trainer.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        raise PretrainedError(
            f"{where} is not a unigram SentencePiece model; the export's tokenizer.json "
            "supports unigram models (electra_jax trains those)"
        )
    if trainer.byte_fallback or trainer.treat_whitespace_as_suffix:
        raise PretrainedError(
            f"{where} uses byte_fallback or treat_whitespace_as_suffix, which the export's "
            "tokenizer.json does not reproduce; train the tokenizer with data.tokenizer=''"
        )
    pieces = [(p.piece, p.score) for p in proto.pieces]
    hf = HFTokenizer(models.Unigram(pieces, unk_id=tokenizer.unk_id, byte_fallback=False))
    steps = []
    if norm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
    if norm.remove_extra_whitespaces:
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    hf.normalizer = normalizers.Sequence(steps)
    scheme = "always" if norm.add_dummy_prefix else "never"
    split = trainer.split_by_whitespace
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
    cls, sep = tokenizer.id_to_piece(tokenizer.cls_id), tokenizer.id_to_piece(tokenizer.sep_id)
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.cls_id), (sep, tokenizer.sep_id)],
    )
    hf.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in SPECIAL_PIECES])
    user = [
        p.piece
        for p in proto.pieces
        if p.type == sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    ]
    if user:  # SentencePiece matches user-defined pieces before segmenting, as added tokens are
        hf.add_tokens([AddedToken(p, normalized=True) for p in user])
    return hf.to_str()


def _special_tokens_map(tokenizer: Any) -> dict[str, str]:
    return {
        f"{name}_token": tokenizer.id_to_piece(getattr(tokenizer, f"{name}_id"))
        for name in ("pad", "unk", "cls", "sep", "mask")
    }


def write_tokenizer_files(tokenizer: Any, folder: str, max_length: int) -> None:
    """The files `transformers.AutoTokenizer.from_pretrained(folder)` loads, plus our own."""
    specials = _special_tokens_map(tokenizer)
    if isinstance(tokenizer, Tokenizer):
        with open(os.path.join(folder, filenames.HF_TOKENIZER_FILE), "w", encoding="utf-8") as f:
            f.write(sentencepiece_tokenizer_json(tokenizer))
        with open(os.path.join(folder, MODEL_FILENAME), "wb") as f:
            f.write(tokenizer.model_proto)
        config = {
            # TokenizersBackend in transformers 5 (the alias is kept); the class in 4.x.
            "tokenizer_class": "PreTrainedTokenizerFast",
            "do_lower_case": False,
            "clean_up_tokenization_spaces": False,
        }
    elif hasattr(tokenizer, "bert_options"):
        tokenizer.save(folder)
        config = {"tokenizer_class": "BertTokenizer", **tokenizer.bert_options}
    else:
        raise PretrainedError(f"cannot export a tokenizer of type {type(tokenizer).__name__}")
    config.update(specials, model_max_length=max_length, model_input_names=MODEL_INPUT_NAMES)
    jsonio.write_json(os.path.join(folder, filenames.HF_TOKENIZER_CONFIG_FILE), config)
    jsonio.write_json(os.path.join(folder, filenames.HF_SPECIAL_TOKENS_FILE), specials)


def read_hf_tokenizer(folder: str) -> Any:
    """spm.model (an electra_jax export: the exact training tokenizer) or vocab.txt (BERT's)."""
    spm_path = os.path.join(folder, MODEL_FILENAME)
    if os.path.isfile(spm_path):
        try:
            return Tokenizer.load(spm_path)
        except DataError as e:
            raise PretrainedError(jsonio.one_line(e, 1000)) from None
    if os.path.isfile(os.path.join(folder, VOCAB_FILENAME)):
        try:
            return WordPieceTokenizer.load(folder)
        except DataError as e:
            raise PretrainedError(str(e)) from None
    raise PretrainedError(
        f"{folder} has neither {MODEL_FILENAME} (an electra_jax export) nor {VOCAB_FILENAME} (a "
        "BERT WordPiece vocabulary, as Google's ELECTRA checkpoints have); copy the model's "
        "tokenizer files into it"
    )
