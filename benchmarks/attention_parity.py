r"""Fused attention against the einsum path: the same weights, the same padded batch.

    python benchmarks/attention_parity.py --config=configs/base.py --attention cudnn   # GPU
    python benchmarks/attention_parity.py --config=configs/tiny.py --attention xla     # any host

Initialises the config's model once, then computes the discriminator's logits and the
generator's at every position with model.attention='einsum' and with `--attention`, both in
`--dtype` (bfloat16 by default, which cuDNN needs), attention dropout off (the fused kernels have
none). Rows end in padding of several lengths, as packing makes them. Prints one JSON line:
the largest absolute difference of each network's logits over the real tokens, the logits'
scale, and `ok` when each difference is within `--tolerance` of that scale. Exits 1 when not ok.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402


def main() -> None:
    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument("--attention", default="cudnn", choices=["xla", "cudnn"])
    ap.add_argument("--dtype", default="bfloat16", choices=_cli.DTYPES)
    ap.add_argument("--batch", type=_cli.positive_int, default=4)
    ap.add_argument("--seq", type=_cli.positive_int, default=128)
    ap.add_argument("--vocab", type=_cli.positive_int, default=30522)
    ap.add_argument(
        "--tolerance", type=_cli.positive_float, default=0.05, help="of the logits' max |value|"
    )
    args = ap.parse_args()
    if args.vocab <= 5:  # the ids drawn are 5..vocab-1, above the special tokens
        ap.error(f"argument --vocab: {args.vocab} is out of range; give a whole number > 5")

    config = _cli.config("--config", args.config)
    config.model.dtype = args.dtype
    config.model.attention_dropout_rate = 0.0
    # Here, not at the top: a refusal of a bad flag above is not kept waiting for jax and flax.
    import jax

    from electra_jax.model import networks as model_lib

    base = model_lib.spec_from_config(config.model, config.generator, args.vocab)
    base = dataclasses.replace(base, max_position_embeddings=max(args.seq, 8))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, args.vocab, (args.batch, args.seq)).astype(np.int32)
    lengths = np.linspace(args.seq, max(args.seq // 4, 2), args.batch).astype(int)
    mask = (np.arange(args.seq)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, ids, 0)
    segments = np.zeros_like(ids)
    positions = np.broadcast_to(np.arange(args.seq), ids.shape)
    params = model_lib.init_params(model_lib.Electra(base), jax.random.PRNGKey(0))

    def logits(attention: str):
        model = model_lib.Electra(dataclasses.replace(base, attention=attention))
        fn = jax.jit(lambda p, *a: model.apply({"params": p}, *a))
        gen, disc = fn(params, ids, segments, mask, positions)
        return np.asarray(gen, np.float32), np.asarray(disc, np.float32)

    ref_gen, ref_disc = logits("einsum")
    gen, disc = logits(args.attention)
    real = mask > 0
    out = {
        "config": args.config,
        "attention": args.attention,
        "dtype": args.dtype,
        "backend": jax.default_backend(),
        "batch": args.batch,
        "seq": args.seq,
    }
    ok = True
    for name, a, b in (("discriminator", disc, ref_disc), ("generator", gen, ref_gen)):
        diff = float(np.abs(a - b)[real].max())
        scale = float(np.abs(b)[real].max())
        out[f"{name}_max_abs_diff"], out[f"{name}_logit_scale"] = diff, scale
        ok = ok and np.isfinite(diff) and diff <= args.tolerance * max(scale, 1e-6)
    out["ok"] = bool(ok)
    print(json.dumps(out))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    _cli.run(main)
