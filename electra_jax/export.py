"""Hugging Face transformers format: export a run, import an export or a released checkpoint.

    python -m electra_jax.export --workdir=runs/tiny --out=runs/tiny/hf

An export D holds:
  D/discriminator/   ElectraForPreTraining: config.json, model.safetensors, tokenizer files
  D/generator/       ElectraForMaskedLM: the same files
  D/export.json      what was exported (source, step, tokenizer fingerprint) and "files", the
                     relative path of every other file the export wrote; marks D as an export
An export into an existing D writes its own files and deletes those of the previous export (its
manifest lists them) that it no longer writes: anything else a user keeps in D stays untouched.
Tokenizer files (each folder): tokenizer.json (the SentencePiece unigram model rebuilt with the
`tokenizers` library, so `AutoTokenizer` loads it without sentencepiece), tokenizer_config.json,
special_tokens_map.json, and spm.model, the original model, which import reads back so that ids
stay those of training.

Our parameter tree keeps one embedding block for both networks; each transformers model gets its
own copy. Attention is fused here ([H, 3, heads, head_dim] for q, k, v; [heads, head_dim, H] for
the output) and split into transformers' four [out, in] Linear weights. The generator's output
layer is tied to the word embeddings (tie_word_embeddings), with its own bias.

Import (`read_hf`) takes an export, or a transformers ELECTRA pair such as Google's released
google/electra-small-discriminator + google/electra-small-generator side by side as
DIR/discriminator and DIR/generator. The spec is built from the two configs directly, so a
generator as wide as the discriminator (Small++'s: hidden 256, embedding 128) keeps its width,
heads and feed-forward size. Those checkpoints use BERT's WordPiece vocab.txt; `WordPieceTokenizer`
gives it our tokenizer's interface.

Export then import is bit-exact: every conversion is a transpose or a reshape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from electra_jax import model
from electra_jax.data.tokenizer import MODEL_FILENAME, SPECIAL_PIECES, Tokenizer
from electra_jax.pretrained import (
    Pretrained,
    PretrainedError,
    check_params,
    check_size,
    json_kind,
    one_line,
)

DISCRIMINATOR, GENERATOR = "discriminator", "generator"
NETWORKS = (DISCRIMINATOR, GENERATOR)
ARCHITECTURES = {DISCRIMINATOR: "ElectraForPreTraining", GENERATOR: "ElectraForMaskedLM"}
MANIFEST = "export.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
VOCAB_TXT = "vocab.txt"
# A single discriminator folder has no generator: one is initialised at the paper's Small width.
DEFAULT_GENERATOR_FRACTION = 0.25
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]


# ------------------------------------------------------------------------- parameter mapping


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One of our leaves and the transformers tensor(s) it becomes, with both conversions."""

    path: tuple[str, ...]  # keys into our params tree
    names: tuple[str, ...]  # transformers state-dict keys
    to_hf: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    from_hf: Callable[[Sequence[np.ndarray]], np.ndarray]


def _copy(path: tuple[str, ...], name: str) -> _Entry:
    return _Entry(path, (name,), lambda x: (x,), lambda xs: xs[0])


def _linear(path: tuple[str, ...], name: str) -> list[_Entry]:
    # flax Dense kernels are [in, out]; torch Linear weights are [out, in].
    return [
        _Entry((*path, "kernel"), (f"{name}.weight",), lambda k: (k.T,), lambda ws: ws[0].T),
        _copy((*path, "bias"), f"{name}.bias"),
    ]


def _layer_norm(path: tuple[str, ...], name: str) -> list[_Entry]:
    return [_copy((*path, "scale"), f"{name}.weight"), _copy((*path, "bias"), f"{name}.bias")]


def _attention(path: tuple[str, ...], name: str, enc: model.EncoderSpec) -> list[_Entry]:
    """Fused q/k/v [H, 3, heads, hd] and output [heads, hd, H] <-> four [H, H] Linear layers.

    transformers splits the query/key/value outputs as [heads, head_dim] (head-major), the same
    order a reshape of our [heads, head_dim] axes gives, so no permutation is needed.
    """
    h, heads = enc.hidden_size, enc.num_heads
    hd = h // heads
    qkv = tuple(f"{name}self.{x}" for x in ("query", "key", "value"))
    return [
        _Entry(
            (*path, "qkv_kernel"),
            tuple(f"{n}.weight" for n in qkv),
            lambda k: tuple(k[:, j].reshape(h, h).T for j in range(3)),
            lambda ws: np.stack([w.T.reshape(h, heads, hd) for w in ws], axis=1),
        ),
        _Entry(
            (*path, "qkv_bias"),
            tuple(f"{n}.bias" for n in qkv),
            lambda b: tuple(b[j].reshape(h) for j in range(3)),
            lambda bs: np.stack([b.reshape(heads, hd) for b in bs]),
        ),
        _Entry(
            (*path, "output_kernel"),
            (f"{name}output.dense.weight",),
            lambda k: (k.reshape(h, h).T,),
            lambda ws: ws[0].T.reshape(heads, hd, h),
        ),
        _copy((*path, "output_bias"), f"{name}output.dense.bias"),
    ]


def _embedding_entries() -> list[_Entry]:
    e = "electra.embeddings."
    return [
        _copy(("embeddings", "word_embeddings", "embedding"), f"{e}word_embeddings.weight"),
        _copy(("embeddings", "position_embeddings", "embedding"), f"{e}position_embeddings.weight"),
        _copy(
            ("embeddings", "token_type_embeddings", "embedding"), f"{e}token_type_embeddings.weight"
        ),
        *_layer_norm(("embeddings", "LayerNorm"), f"{e}LayerNorm"),
    ]


def _encoder_entries(spec: model.ElectraSpec, network: str) -> list[_Entry]:
    enc = getattr(spec, network)
    entries = []
    if spec.embedding_size != enc.hidden_size:
        entries += _linear((network, "embeddings_project"), "electra.embeddings_project")
    for i in range(enc.num_layers):
        ours, hf = (network, f"layer_{i}"), f"electra.encoder.layer.{i}."
        entries += _attention((*ours, "attention"), f"{hf}attention.", enc)
        entries += _layer_norm((*ours, "attention_LayerNorm"), f"{hf}attention.output.LayerNorm")
        entries += _linear((*ours, "intermediate"), f"{hf}intermediate.dense")
        entries += _linear((*ours, "output"), f"{hf}output.dense")
        entries += _layer_norm((*ours, "output_LayerNorm"), f"{hf}output.LayerNorm")
    return entries


def mapping(spec: model.ElectraSpec) -> dict[str, list[_Entry]]:
    """Per network, every leaf's conversion; the embedding entries appear in both networks."""
    disc = [
        *_embedding_entries(),
        *_encoder_entries(spec, DISCRIMINATOR),
        *_linear(("discriminator_predictions_dense",), "discriminator_predictions.dense"),
        *_linear(
            ("discriminator_predictions_dense_prediction",),
            "discriminator_predictions.dense_prediction",
        ),
    ]
    gen = [
        *_embedding_entries(),
        *_encoder_entries(spec, GENERATOR),
        *_linear(("generator_predictions_dense",), "generator_predictions.dense"),
        *_layer_norm(("generator_predictions_LayerNorm",), "generator_predictions.LayerNorm"),
        _copy(("generator_lm_head_bias",), "generator_lm_head.bias"),
    ]
    return {DISCRIMINATOR: disc, GENERATOR: gen}


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def params_to_hf(params: dict, spec: model.ElectraSpec) -> dict[str, dict[str, np.ndarray]]:
    """Our params -> {network: {transformers key: contiguous float32 array}}."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for network, entries in mapping(spec).items():
        tensors = {}
        for entry in entries:
            values = entry.to_hf(np.asarray(_get(params, entry.path), np.float32))
            for name, value in zip(entry.names, values, strict=True):
                tensors[name] = np.ascontiguousarray(value)
        out[network] = tensors
    return out


def params_from_hf(
    tensors: dict[str, dict[str, np.ndarray]], spec: model.ElectraSpec, where: dict[str, str]
) -> dict:
    """{network: state dict} -> our params (generator subtrees only when tensors has one).

    The shared embedding block is taken from the discriminator; a generator whose embeddings
    differ gets a warning (ELECTRA trains them as one, so they should not).

    Raises:
      PretrainedError: a tensor is missing or has a shape the config does not imply.
    """
    params: dict = {}
    shared = {e.path for e in _embedding_entries()}
    for network, entries in mapping(spec).items():
        if network not in tensors:
            continue
        state = tensors[network]
        for entry in entries:
            missing = [n for n in entry.names if n not in state]
            if missing:
                raise PretrainedError(
                    f"{where[network]} has no tensor {missing[0]} (an ELECTRA "
                    f"{ARCHITECTURES[network]} checkpoint with {getattr(spec, network).num_layers}"
                    " layers has one)"
                )
            try:
                value = entry.from_hf([np.asarray(state[n], np.float32) for n in entry.names])
            except ValueError:
                shapes = [tuple(state[n].shape) for n in entry.names]
                raise PretrainedError(
                    f"{where[network]}: {entry.names[0]} has shape {shapes[0]}, which its "
                    "config.json does not imply"
                ) from None
            value = np.ascontiguousarray(value, np.float32)
            if network == GENERATOR and entry.path in shared:
                if not np.array_equal(value, _get(params, entry.path)):
                    logging.warning(
                        "%s: %s differs from the discriminator's; ELECTRA shares the "
                        "embeddings, the discriminator's are used",
                        where[network],
                        entry.names[0],
                    )
                continue
            _set(params, entry.path, value)
    head = tensors.get(GENERATOR, {}).get("generator_lm_head.weight")
    if head is not None and not np.array_equal(
        np.asarray(head, np.float32), params["embeddings"]["word_embeddings"]["embedding"]
    ):
        logging.warning(
            "%s: generator_lm_head.weight is not tied to the word embeddings; the tied "
            "embeddings are used",
            where[GENERATOR],
        )
    return params


# ------------------------------------------------------------------------- configs


def hf_config(spec: model.ElectraSpec, network: str, pad_id: int) -> dict:
    """transformers' ElectraConfig fields for one network."""
    enc = getattr(spec, network)
    return {
        "architectures": [ARCHITECTURES[network]],
        "model_type": "electra",
        "vocab_size": spec.vocab_size,
        "embedding_size": spec.embedding_size,
        "hidden_size": enc.hidden_size,
        "num_hidden_layers": enc.num_layers,
        "num_attention_heads": enc.num_heads,
        "intermediate_size": enc.intermediate_size,
        "hidden_act": "gelu",  # transformers' "gelu" is the exact erf form, as ours
        "hidden_dropout_prob": spec.dropout_rate,
        "attention_probs_dropout_prob": spec.attention_dropout_rate,
        "max_position_embeddings": spec.max_position_embeddings,
        "type_vocab_size": spec.type_vocab_size,
        "initializer_range": spec.initializer_range,
        "layer_norm_eps": spec.layer_norm_eps,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


_REQUIRED = object()


def _hf_size(config: dict, field: str, limit: str, where: str, default: Any = _REQUIRED) -> int:
    """config[field] (or `default` when absent and allowed), checked to be a sane positive int."""
    if field not in config and default is _REQUIRED:
        raise PretrainedError(
            f"{where}/config.json lacks the ElectraConfig field {field!r}; save the model again "
            "with transformers' save_pretrained"
        )
    return check_size(config.get(field, default), field, limit, f"{where}/config.json")


def _hf_rate(
    config: dict, field: str, default: float, where: str, low: float, high: float
) -> float:
    """config[field] (default when absent) as a float with low <= value < high."""
    value = config.get(field, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and low <= value < high):
        raise PretrainedError(
            f"{where}/config.json: {field} is {one_line(repr(value), 60)}; it must be a number "
            f"from {low} to below {high}: correct the file or fetch it again"
        )
    return float(value)


def _encoder_from_hf(config: dict, where: str) -> model.EncoderSpec:
    enc = model.EncoderSpec(
        hidden_size=_hf_size(config, "hidden_size", "hidden_size", where),
        num_layers=_hf_size(config, "num_hidden_layers", "num_layers", where),
        num_heads=_hf_size(config, "num_attention_heads", "num_heads", where),
        intermediate_size=_hf_size(config, "intermediate_size", "intermediate_size", where),
    )
    if enc.hidden_size % enc.num_heads:
        raise PretrainedError(
            f"{where}/config.json: hidden_size {enc.hidden_size} is not a multiple of "
            f"num_attention_heads {enc.num_heads}; correct the file or fetch it again"
        )
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise PretrainedError(
            f"{where}: hidden_act={act!r}; electra_jax implements ELECTRA's exact 'gelu' only"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise PretrainedError(
            f"{where}: position_embedding_type={config['position_embedding_type']!r}; only "
            "'absolute' is supported"
        )
    return enc


SHARED_FIELDS = ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size")


def spec_from_hf(disc: dict, gen: dict | None, where: dict[str, str]) -> model.ElectraSpec:
    """An ElectraSpec from the two transformers configs (the generator's own width and heads).

    Without a generator config the generator is the paper's Small one: 1/4 of the width.
    """
    d = _encoder_from_hf(disc, where[DISCRIMINATOR])
    g = (
        _encoder_from_hf(gen, where[GENERATOR])
        if gen is not None
        else model.generator_spec(d, DEFAULT_GENERATOR_FRACTION)
    )
    w = where[DISCRIMINATOR]
    shared = {
        "vocab_size": _hf_size(disc, "vocab_size", "vocab_size", w),
        "embedding_size": _hf_size(disc, "embedding_size", "embedding_size", w, d.hidden_size),
        "max_position_embeddings": _hf_size(
            disc, "max_position_embeddings", "max_position_embeddings", w
        ),
        "type_vocab_size": _hf_size(disc, "type_vocab_size", "type_vocab_size", w),
    }
    if gen is not None:
        gen_shared = dict(shared, embedding_size=gen.get("embedding_size", g.hidden_size))
        for field in SHARED_FIELDS:
            value = gen.get(field, gen_shared[field])
            if value != shared[field]:
                raise PretrainedError(
                    f"{where[GENERATOR]}: {field}={value} but the discriminator's is "
                    f"{shared[field]}; ELECTRA's two networks share the embeddings"
                )
    return model.ElectraSpec(
        **shared,
        discriminator=d,
        generator=g,
        dropout_rate=_hf_rate(disc, "hidden_dropout_prob", 0.1, w, 0.0, 1.0),
        attention_dropout_rate=_hf_rate(disc, "attention_probs_dropout_prob", 0.1, w, 0.0, 1.0),
        initializer_range=_hf_rate(disc, "initializer_range", 0.02, w, 0.0, 1e3),
        layer_norm_eps=_hf_rate(disc, "layer_norm_eps", 1e-12, w, 1e-300, 1.0),
    )


# ------------------------------------------------------------------------- tokenizers


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
    cls, sep = SPECIAL_PIECES[tokenizer.cls_id], SPECIAL_PIECES[tokenizer.sep_id]
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
        with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
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
    _write_json(os.path.join(folder, "tokenizer_config.json"), config)
    _write_json(os.path.join(folder, "special_tokens_map.json"), specials)


# The options of tokenizer_config.json that WordPieceTokenizer reads, and their allowed values.
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
            raise PretrainedError(
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
        path = os.path.join(folder, VOCAB_TXT)
        try:
            with open(path, encoding="utf-8") as f:
                vocab = [line.rstrip("\r\n") for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise PretrainedError(f"{path} cannot be read ({e})") from None
        config_path = os.path.join(folder, "tokenizer_config.json")
        options = _read_json_object(
            config_path, "a tokenizer_config.json is an object of options", default={}
        )
        for name, allowed in _BERT_OPTIONS.items():
            if name in options and not any(options[name] is v for v in allowed):
                raise PretrainedError(
                    f"{config_path}: {name} is {one_line(repr(options[name]), 60)}; it must be "
                    f"one of {' or '.join(map(json.dumps, allowed))}: correct the file"
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

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; special tokens decode to nothing."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, out_dir: str) -> None:
        """Writes out_dir/vocab.txt and out_dir/tokenizer_config.json (what `load` reads)."""
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, VOCAB_TXT), "w", encoding="utf-8") as f:
            f.write("".join(f"{p}\n" for p in self._vocab))
        config = {"tokenizer_class": "BertTokenizer", **self.bert_options}
        _write_json(os.path.join(out_dir, "tokenizer_config.json"), config)

    def id_to_piece(self, token_id: int) -> str:
        return self._vocab[int(token_id)]

    def piece_to_id(self, piece: str) -> int:
        return self._ids.get(piece, self._unk)


def read_hf_tokenizer(folder: str) -> Any:
    """spm.model (an electra_jax export: the exact training tokenizer) or vocab.txt (BERT's)."""
    from electra_jax.data import DataError

    spm_path = os.path.join(folder, MODEL_FILENAME)
    if os.path.isfile(spm_path):
        try:
            return Tokenizer.load(spm_path)
        except DataError as e:
            raise PretrainedError(one_line(e, 1000)) from None
    if os.path.isfile(os.path.join(folder, VOCAB_TXT)):
        return WordPieceTokenizer.load(folder)
    raise PretrainedError(
        f"{folder} has neither {MODEL_FILENAME} (an electra_jax export) nor {VOCAB_TXT} (a BERT "
        "WordPiece vocabulary, as Google's ELECTRA checkpoints have); copy the model's tokenizer "
        "files into it"
    )


# ------------------------------------------------------------------------- reading and writing


def _read_json(path: str, default: Any = None) -> Any:
    if default is not None and not os.path.exists(path):
        return default
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise PretrainedError(f"{path} is missing") from None
    except (OSError, ValueError) as e:
        raise PretrainedError(
            f"{path} cannot be read ({one_line(e, 200)}); fetch or export it again"
        ) from None


def _read_json_object(path: str, what: str, default: Any = None) -> dict:
    """_read_json, refusing a file whose top level is not an object (`what`: what it must be)."""
    value = _read_json(path, default)
    if not isinstance(value, dict):
        raise PretrainedError(
            f"{path} holds a JSON {json_kind(value)}, not an object ({what}); fetch or export it "
            "again"
        )
    return value


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def read_hf_config(folder: str) -> dict:
    config = _read_json_object(
        os.path.join(folder, "config.json"), "a transformers config.json is an object"
    )
    if config.get("model_type") != "electra":
        raise PretrainedError(
            f"{folder}/config.json is not an ELECTRA config (model_type="
            f"{one_line(repr(config.get('model_type')), 60)}); give an ELECTRA model folder"
        )
    return config


def read_hf_tensors(folder: str) -> dict[str, np.ndarray]:
    """A transformers checkpoint's state dict as numpy arrays.

    model.safetensors (or its sharded index) is read with safetensors' numpy API; a
    pytorch_model.bin only when torch is installed (unpickling it needs torch).
    """
    from safetensors.numpy import load_file

    single, index = os.path.join(folder, WEIGHTS), os.path.join(folder, WEIGHTS_INDEX)
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        files = [os.path.join(folder, name) for name in _shard_names(index)]
    elif os.path.isfile(os.path.join(folder, TORCH_WEIGHTS)):
        return _read_torch_bin(os.path.join(folder, TORCH_WEIGHTS))
    else:
        raise PretrainedError(
            f"{folder} has no {WEIGHTS} (nor {WEIGHTS_INDEX} or {TORCH_WEIGHTS}); it is not a "
            "saved transformers model"
        )
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        try:
            tensors.update(load_file(path))
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise PretrainedError(
                f"{path} cannot be read ({type(e).__name__}: {one_line(e, 200)}); download or "
                "export it again (bfloat16 files need converting to float32)"
            ) from None
    return tensors


def _plain_file_name(name: Any) -> bool:
    """Whether `name` names a file in the folder itself: no separator, no '..', not absolute."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and not os.path.isabs(name)
        and os.path.basename(name) == name
    )


def _shard_names(index: str) -> list[str]:
    """The shard files a model.safetensors.index.json names, each a plain file beside it.

    Paths read from a file never leave its folder: a weight_map value with a separator, '..' or
    an absolute path is refused rather than read.
    """
    data = _read_json_object(index, "a sharded checkpoint's index is an object with a weight_map")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        shown = "empty" if weight_map == {} else f"a JSON {json_kind(weight_map)}"
        raise PretrainedError(
            f"{index}: weight_map is {shown}, not an object of tensor name -> shard file; save "
            "the model again with save_pretrained"
        )
    for key, name in weight_map.items():
        if not _plain_file_name(name):
            raise PretrainedError(
                f"{index}: weight_map[{one_line(repr(key), 80)}] is {one_line(repr(name), 80)}, "
                "not the name of a file beside the index; shards must sit in the index's own "
                "folder"
            )
    return sorted(set(weight_map.values()))


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    import pickle
    import zipfile

    convert = (
        f"convert it to {WEIGHTS} where the source is trusted (transformers' "
        "save_pretrained(dir, safe_serialization=True))"
    )
    try:
        import torch
    except ImportError:
        raise PretrainedError(
            f"{path} is a PyTorch pickle and torch is not installed; {convert} or pip install torch"
        ) from None
    # torch's messages are not shown: they can recommend weights_only=False, which runs any code
    # the pickle holds.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if zipfile.is_zipfile(path):
            raise PretrainedError(
                f"{path} holds objects other than tensors, which are not loaded; {convert}"
            ) from None
        raise PretrainedError(
            f"{path} is damaged or holds objects other than tensors; download it again or {convert}"
        ) from None
    except Exception as e:  # torch raises many types for damaged files
        raise PretrainedError(
            f"{path} is damaged or not a PyTorch checkpoint (torch.load raised "
            f"{type(e).__name__}); download it again or {convert}"
        ) from None
    check_state_dict(state, path, torch.Tensor)
    return {k: v.detach().float().numpy() for k, v in state.items()}


def check_state_dict(state: Any, path: str, tensor_type: type) -> None:
    """PretrainedError unless `state` is a non-empty dict of str -> `tensor_type` (torch.Tensor
    for a pytorch_model.bin): the pickle may hold any plain data weights_only allows."""
    if not isinstance(state, dict):
        raise PretrainedError(
            f"{path} holds a {type(state).__name__}, not a state dict (tensor name -> tensor); "
            f"give the file transformers' save_pretrained writes, or {WEIGHTS}"
        )
    if not state:
        raise PretrainedError(f"{path} holds no tensors; download or save the model again")
    for key, value in state.items():
        if not isinstance(key, str):
            raise PretrainedError(
                f"{path} has a key {one_line(repr(key), 80)} that is not a tensor name, so the "
                f"file is not a transformers state dict; give the file save_pretrained writes, "
                f"or {WEIGHTS}"
            )
        if not isinstance(value, tensor_type):
            raise PretrainedError(
                f"{path}: entry {one_line(repr(key), 80)} holds a {type(value).__name__}, not a "
                f"tensor, so the file is not a transformers state dict; give the file "
                f"save_pretrained writes, or {WEIGHTS}"
            )


def read_hf(directory: str) -> Pretrained:
    """An export, a transformers ELECTRA pair (DIR/discriminator, DIR/generator) or one folder.

    A single (discriminator) folder gets a freshly initialised generator of 1/4 its width
    (seed 0), with a warning: fine; for fine-tuning, which uses the discriminator only.
    """
    from electra_jax.pretrained import HF_PREFIX

    if not os.path.isdir(directory):
        raise PretrainedError(
            f"{directory} does not exist or is not a directory; give a folder holding "
            "discriminator/ and generator/ (or one ELECTRA model folder)"
        )
    where = {
        DISCRIMINATOR: os.path.join(directory, DISCRIMINATOR),
        GENERATOR: os.path.join(directory, GENERATOR),
    }
    if os.path.isdir(where[DISCRIMINATOR]):
        has_generator = os.path.isdir(where[GENERATOR])
    elif os.path.isfile(os.path.join(directory, "config.json")):
        where[DISCRIMINATOR], has_generator = directory, False
    else:
        raise PretrainedError(
            f"{directory} holds neither discriminator/ (an export or a model pair) nor "
            "config.json (one transformers model folder)"
        )
    disc_config = read_hf_config(where[DISCRIMINATOR])
    gen_config = read_hf_config(where[GENERATOR]) if has_generator else None
    spec = spec_from_hf(disc_config, gen_config, where)
    tensors = {DISCRIMINATOR: read_hf_tensors(where[DISCRIMINATOR])}
    if has_generator:
        tensors[GENERATOR] = read_hf_tensors(where[GENERATOR])
    params = params_from_hf(tensors, spec, where)
    source = f"{HF_PREFIX}{directory}"
    if not has_generator:
        params = _with_fresh_generator(params, spec)
        note = (
            f"no generator in {directory}: initialised one {spec.generator.hidden_size} wide "
            f"(1/{round(1 / DEFAULT_GENERATOR_FRACTION)} of the discriminator), seed 0"
        )
        logging.warning("%s", note)
        source += f" ({note})"
    check_params(params, spec, directory)
    tokenizer = read_hf_tokenizer(where[DISCRIMINATOR])
    if tokenizer.vocab_size > spec.vocab_size:
        raise PretrainedError(
            f"{where[DISCRIMINATOR]}: the tokenizer has {tokenizer.vocab_size} tokens but the "
            f"model's vocab_size is {spec.vocab_size}"
        )
    return Pretrained(spec, params, tokenizer, source)


def _with_fresh_generator(params: dict, spec: model.ElectraSpec, seed: int = 0) -> dict:
    """`params` plus every subtree it lacks, initialised as model.Electra does.

    Kernels and embeddings ~ truncated normal (+-2 std, std initializer_range), LayerNorm scales
    1, biases 0; drawn with numpy, because compiling Flax's init for this takes seconds.
    """
    import jax

    from electra_jax.pretrained import abstract_params

    rng = np.random.default_rng(seed)

    def init(path, leaf) -> np.ndarray:
        name = str(getattr(path[-1], "key", path[-1]))
        if name == "scale":
            return np.ones(leaf.shape, np.float32)
        if name.endswith("bias"):
            return np.zeros(leaf.shape, np.float32)
        z = rng.standard_normal(leaf.shape)
        while (outside := np.abs(z) > 2).any():
            z[outside] = rng.standard_normal(int(outside.sum()))
        return (z * spec.initializer_range).astype(np.float32)

    missing = {k: v for k, v in abstract_params(spec).items() if k not in params}
    return {**jax.tree_util.tree_map_with_path(init, missing), **params}


FORMAT, VERSION = "electra_jax.export", 2
# While one export replaces another, the union of both file lists waits here (hidden) in place of
# export.json, so that a folder a crash leaves half replaced is still recognised as ours, with
# every file either export wrote, and the next export finishes the job.
PARTIAL_MANIFEST = ".export.json.partial"
# Hidden folders in OUT where an export is written before each file is renamed into place.
TMP_PREFIX = ".electra_jax-export-"
# The files exports of version 1 wrote (their export.json lists none): only these are replaced.
V1_FILES = tuple(
    f"{network}/{name}"
    for network in NETWORKS
    for name in (
        "config.json",
        WEIGHTS,
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        MODEL_FILENAME,
        VOCAB_TXT,
    )
)


def _relative_file(rel: Any) -> bool:
    """Whether a manifest entry is a path inside the export: '/'-separated parts, none empty,
    '..' or hidden, so not absolute either."""
    if not isinstance(rel, str) or "\\" in rel or "\0" in rel:
        return False
    return all(part and not part.startswith(".") for part in rel.split("/"))


def _is_tmp(out: str, name: str) -> bool:
    path = os.path.join(out, name)
    return name.startswith(TMP_PREFIX) and os.path.isdir(path) and not os.path.islink(path)


def _no_link_on_the_way(out: str, rel: str) -> bool:
    """Whether every folder between OUT and OUT/rel is a real folder (or absent), so that writing
    or deleting OUT/rel stays inside OUT."""
    parent = out
    for part in rel.split("/")[:-1]:
        parent = os.path.join(parent, part)
        if os.path.islink(parent) or (os.path.lexists(parent) and not os.path.isdir(parent)):
            return False
    return True


def _manifest_files(out: str, name: str) -> set[str]:
    """The files the manifest OUT/name says an export wrote; PretrainedError unless it is ours."""
    path = os.path.join(out, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        raise PretrainedError(
            f"--out {out}: its {name} is not JSON, so the folder is not an electra_jax export; "
            "choose another --out (nothing was changed)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        what = f"format {data.get('format')!r}" if isinstance(data, dict) else json_kind(data)
        raise PretrainedError(
            f"--out {out}: its {name} was not written by electra_jax (a JSON "
            f"{one_line(what, 60)}); choose another --out (nothing was changed)"
        )
    if "files" not in data:  # version 1: the layout it wrote, as far as it is there
        return {rel for rel in V1_FILES if os.path.lexists(os.path.join(out, rel))}
    files = data["files"]
    if not isinstance(files, list):
        raise PretrainedError(
            f"{path}: files is a JSON {json_kind(files)}, not a list of paths inside the export; "
            "choose another --out (nothing was changed)"
        )
    for rel in files:
        if not _relative_file(rel):
            raise PretrainedError(
                f"{path}: files lists {one_line(repr(rel), 80)}, which is not a path inside the "
                "export; choose another --out (nothing was changed)"
            )
    return set(files)


def _check_out(out: str) -> list[str]:
    """The files of the previous export at OUT that a new export replaces or deletes ([] when
    OUT is missing or empty): an export replaces only what an export wrote.

    Raises:
      PretrainedError: OUT is a file, or a folder that holds anything but no export.json of ours.
    """
    if not os.path.lexists(out):
        return []
    if not os.path.isdir(out):
        raise PretrainedError(f"--out {out} is a file; choose a directory path")
    names = [n for n in os.listdir(out) if not _is_tmp(out, n)]
    manifests = [n for n in (MANIFEST, PARTIAL_MANIFEST) if n in names]
    if not manifests and names:
        raise PretrainedError(
            f"--out {out} exists and is not an electra_jax export (no {MANIFEST}); choose "
            "another --out or empty it"
        )
    files: set[str] = set()
    for name in manifests:
        files |= _manifest_files(out, name)
    return sorted(files)


def _files_below(folder: str) -> list[str]:
    """Every file under `folder`, as sorted '/'-separated relative paths."""
    found = []
    for root, _, names in os.walk(folder):
        rel = os.path.relpath(root, folder)
        found += [name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}" for name in names]
    return sorted(found)


def _write_networks(pretrained: Pretrained, folder: str) -> list[str]:
    """FOLDER/discriminator and FOLDER/generator; returns the files written."""
    from safetensors.numpy import save_file

    spec, tokenizer = pretrained.spec, pretrained.tokenizer
    tensors = params_to_hf(pretrained.params, spec)
    for network in NETWORKS:
        sub = os.path.join(folder, network)
        os.makedirs(sub)
        _write_json(os.path.join(sub, "config.json"), hf_config(spec, network, tokenizer.pad_id))
        # "pt" is what transformers expects in the metadata of a PyTorch-loadable file.
        save_file(tensors[network], os.path.join(sub, WEIGHTS), metadata={"format": "pt"})
        write_tokenizer_files(tokenizer, sub, spec.max_position_embeddings)
    return _files_below(folder)


def _move_into_place(out: str, tmp: str, previous: list[str], files: list[str]) -> None:
    """Renames each file of TMP (a new export, its manifest included) into OUT, deletes the
    files of the previous export that the new one does not write, and leaves all else alone.

    Every file is replaced by one os.replace, so each is whole, old or new; export.json, written
    last, says the export is complete. Until then PARTIAL_MANIFEST lists both exports' files.
    """
    for rel in files:
        target = os.path.join(out, rel)
        if not _no_link_on_the_way(out, rel) or (
            os.path.isdir(target) and not os.path.islink(target)
        ):
            raise PretrainedError(
                f"--out {out}: {rel} cannot be written (a folder, a file or a link stands in its "
                "way); move that away or choose another --out (nothing was changed)"
            )
    partial = {"format": FORMAT, "version": VERSION, "files": sorted({*previous, *files})}
    _write_json(os.path.join(tmp, PARTIAL_MANIFEST), partial)
    os.replace(os.path.join(tmp, PARTIAL_MANIFEST), os.path.join(out, PARTIAL_MANIFEST))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out, MANIFEST))
    for rel in files:
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(tmp, rel), target)
    for rel in sorted(set(previous) - set(files)):
        target = os.path.join(out, rel)
        if _no_link_on_the_way(out, rel) and (os.path.islink(target) or os.path.isfile(target)):
            os.remove(target)
            parent = os.path.dirname(target)
            while parent != out and not os.listdir(parent):  # folders only it filled
                os.rmdir(parent)
                parent = os.path.dirname(parent)
    os.replace(os.path.join(tmp, MANIFEST), os.path.join(out, MANIFEST))
    os.remove(os.path.join(out, PARTIAL_MANIFEST))


def write_export(pretrained: Pretrained, out: str) -> dict:
    """Writes OUT/discriminator, OUT/generator and OUT/export.json; returns the manifest.

    OUT may be missing, empty, or a previous export; anything else is refused. The export is
    written into a hidden folder inside OUT, then each file is renamed into place, so every file
    is whole. Of a previous export only the files it wrote (its manifest lists them) are replaced
    or deleted: whatever else the user keeps in OUT stays as it is.
    """
    out = os.path.abspath(out)
    if pretrained.spec.embedding_sharing != "electra":
        raise PretrainedError(
            f"{pretrained.source} was trained with model.embedding_sharing="
            f"'{pretrained.spec.embedding_sharing}'; exporting it is not supported yet (a "
            "transformers pair has one embedding block each); fine-tune it with electra_jax"
        )
    previous = _check_out(out)
    counts = model.network_param_counts(pretrained.params)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "source": pretrained.source,
        "tokenizer_fingerprint": pretrained.tokenizer.fingerprint,
        "discriminator_params": counts[DISCRIMINATOR],
        "generator_params": counts[GENERATOR],
    }
    created = not os.path.isdir(out)
    try:
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):  # left by an export that was interrupted
            if _is_tmp(out, name):
                shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=out)
        try:
            manifest["files"] = _write_networks(pretrained, tmp)
            _write_json(os.path.join(tmp, MANIFEST), manifest)
            _move_into_place(out, tmp, previous, manifest["files"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if created and not os.listdir(out):
                os.rmdir(out)
    except OSError as e:
        raise PretrainedError(
            f"cannot write the export to {out} ({one_line(e, 200)}); check the folder's "
            "permissions and free space, then export again"
        ) from None
    return manifest


def export(workdir: str, out: str) -> dict:
    """A workdir's newest checkpoint -> OUT (see write_export); returns the manifest."""
    from electra_jax.pretrained import load_workdir

    _check_out(os.path.abspath(out))  # before the restore, so a bad --out fails at once
    if not os.path.isdir(workdir):
        raise PretrainedError(f"--workdir {workdir} does not exist; give a pre-training workdir")
    return write_export(load_workdir(workdir), out)


# ------------------------------------------------------------------------- command line


def _define_flags():
    # Defined only when run as a program, so that importing this module (load_pretrained does,
    # for hf: paths) never clashes with the flags of the train or finetune commands.
    from absl import flags

    flags.DEFINE_string("workdir", None, "The pre-training workdir to export (newest checkpoint).")
    flags.DEFINE_string("out", None, "Where discriminator/ and generator/ go (default WORKDIR/hf).")
    flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv) -> None:
    from absl import flags

    from electra_jax.cli import fail

    values = flags.FLAGS
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; use --workdir=... --out=...")
    if not values.workdir:
        fail("--workdir is required: the pre-training run to export, e.g. --workdir=runs/tiny")
    if not values.verbose:
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    out = values.out or os.path.join(values.workdir, "hf")
    try:
        manifest = export(values.workdir, out)
    except PretrainedError as e:
        if values.verbose:
            raise
        fail(str(e))
    print(
        f"exported {manifest['source']} to {os.path.abspath(out)}: discriminator "
        f"{manifest['discriminator_params']:,} params, generator "
        f"{manifest['generator_params']:,} params"
    )


def cli() -> None:
    from absl import app

    from electra_jax.cli import parse_flags

    _define_flags()
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    # Run the importable copy of this module, so that its classes are the ones pretrained.py
    # imports (python -m executes a second copy named __main__).
    from electra_jax import export as _module

    _module.cli()
