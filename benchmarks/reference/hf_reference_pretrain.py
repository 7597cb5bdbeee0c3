"""Independent reference ELECTRA pre-training in PyTorch + Hugging Face transformers.

Trains on exactly the batches the JAX trainer (electra_jax) sees: the same config, tokenizer,
prepared shards and Grain iterator (the project's data path is used for token batches only).
Model, objective and optimizer follow google-research/electra (run_pretraining.py,
pretrain/pretrain_helpers.py, model/optimization.py), not electra_jax's own code.

    # from the project's root, in its environment (torch and transformers: the test extra)
    python benchmarks/reference/hf_reference_pretrain.py --workdir runs/tiny --num_steps 600 \
        --log_every 20 [--config configs/tiny.py] [--source builtin] [--out F.jsonl]

--config takes a config .py (get_config()) or a JAX run's WORKDIR/config.json (its exact config).

Writes one JSON line per --log_every steps (default: WORKDIR/hf_reference_metrics.jsonl), with
the keys of the JAX run's metrics.jsonl, each the value of that step's batch (no averaging).
"""

import argparse
import json
import math
import os
import runpy
import sys
import time

import ml_collections
import numpy as np
import torch
import torch.nn.functional as F
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

from electra_jax.data import pipeline, shards


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", required=True, help="a JAX run's workdir (tokenizer/, data/)")
    p.add_argument("--config", default="configs/tiny.py", help=".py or config.json")
    p.add_argument("--num_steps", type=int, help="config.train.num_steps (also sets the schedule)")
    p.add_argument("--log_every", type=int, help="default config.log.every_steps")
    p.add_argument("--source", help="config.data.source")
    p.add_argument("--out", help="metrics jsonl; default WORKDIR/hf_reference_metrics.jsonl")
    p.add_argument(
        "--schedule",
        choices=["official", "piecewise"],
        default="official",
        help="official: peak*min(1,s/W)*(1-s/T), as optimization.py; "
        "piecewise: warm-up to peak at W, then linear to 0 at T",
    )
    return p.parse_args()


# ------------------------------------------------------------------------------------- model
def build_models(cfg, vocab_size):
    m = cfg.model
    common = dict(
        vocab_size=vocab_size,
        embedding_size=m.embedding_size,
        hidden_act="gelu",
        max_position_embeddings=m.max_position_embeddings,
        type_vocab_size=m.type_vocab_size,
        hidden_dropout_prob=m.dropout_rate,
        attention_probs_dropout_prob=m.attention_dropout_rate,
        layer_norm_eps=m.layer_norm_eps,
        initializer_range=0.02,
        pad_token_id=0,
    )
    disc = ElectraForPreTraining(
        ElectraConfig(
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            intermediate_size=m.intermediate_size,
            **common,
        )
    )
    # run_pretraining.get_generator_config: a fraction of the width (and depth), 64-wide heads.
    gh = int(round(m.hidden_size * cfg.generator.hidden_fraction))
    gen = ElectraForMaskedLM(
        ElectraConfig(
            hidden_size=gh,
            num_hidden_layers=int(round(m.num_layers * cfg.generator.layers_fraction)),
            num_attention_heads=max(1, gh // 64),
            intermediate_size=4 * gh,
            **common,
        )
    )
    # Shared "electra/embeddings" scope: word, position, token-type tables and their LayerNorm;
    # each network keeps its own embeddings_project. The MLM output is tied to the word table.
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    both = torch.nn.ModuleDict({"disc": disc, "gen": gen})
    # Official initialisation: truncated normal (std 0.02, cut at 2 std) for embedding tables and
    # dense kernels, zero biases; Glorot-uniform for the two tf.layers.dense given no initializer
    # (embeddings_project, the discriminator's 1-unit output). Also un-zeroes HF's [PAD] row.
    with torch.no_grad():
        for name, mod in both.named_modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                if name.endswith(("embeddings_project", "dense_prediction")):
                    torch.nn.init.xavier_uniform_(mod.weight)
                elif not name.endswith("generator_lm_head"):  # tied to the word table
                    torch.nn.init.trunc_normal_(mod.weight, std=0.02, a=-0.04, b=0.04)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
    assert gen.generator_lm_head.weight is disc.electra.embeddings.word_embeddings.weight
    return disc, gen, both


# ------------------------------------------------------------------------------------- objective
def scatter_update(seq, updates, positions):
    """pretrain_helpers.scatter_update for int ids: writes updates [B,N] at positions [B,N];
    writes to position 0 are ignored; a position hit several times gets the floor of the mean
    of its updates (the official behaviour). Returns (new seq, hit mask)."""
    total = torch.zeros_like(seq).scatter_add_(1, positions, updates)
    count = torch.zeros_like(seq).scatter_add_(1, positions, torch.ones_like(updates))
    count[:, 0] = 0
    hit = count > 0
    return torch.where(hit, total // count.clamp(min=1), seq), hit


def mask_batch(ids, input_mask, N, cfg, special):
    """pretrain_helpers.mask: N slots per row sampled WITH replacement among non-special, non-pad
    positions; round(mask_prob * non-pad count) of them used (>= 1, <= N); 85% of used slots
    become [MASK]. Unused slots point at position 0 (ignored by scatter_update)."""
    B, L = ids.shape
    cand = input_mask.bool()
    for t in (special["cls"], special["sep"], special["mask"]):
        cand &= ids != t
    num_tokens = input_mask.sum(-1).float()  # [CLS]/[SEP] count here, as in the official
    num_pred = torch.round(num_tokens * cfg.objective.mask_prob).long().clamp(1, N)
    weights = (torch.arange(N)[None, :] < num_pred[:, None]).long()  # masked_lm_weights
    probs = cand.float()
    probs[:, 0] += probs.sum(-1) == 0  # guard: a row with no candidate points at (ignored) 0
    positions = torch.multinomial(probs, N, replacement=True) * weights
    target = ids.gather(1, positions) * weights  # masked_lm_ids
    use_mask = (torch.rand(B, N) < cfg.objective.mask_token_prob).long()
    mask_ids = torch.full_like(positions, special["mask"])
    gen_ids, _ = scatter_update(ids, mask_ids, positions * use_mask)
    return gen_ids, positions, target, weights.float()


def electra_step(disc, gen, batch, N, cfg, special):
    """One forward pass of run_pretraining.PretrainingModel; returns (total loss, metrics)."""
    ids, seg, am = batch["input_ids"], batch["segment_ids"], batch["input_mask"]
    gen_ids, pos, target, w = mask_batch(ids, am, N, cfg, special)
    # Generator: MLM logits only at the N slots (gather, then dense+gelu+LN, tied output + bias).
    h = gen.electra(input_ids=gen_ids, attention_mask=am, token_type_ids=seg).last_hidden_state
    h = h.gather(1, pos[:, :, None].expand(-1, -1, h.shape[-1]))
    logits = gen.generator_lm_head(gen.generator_predictions(h))  # [B, N, V]
    nll = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view_as(w)
    gen_loss = (w * nll).sum() / (w.sum() + 1e-6)
    # Replacements sampled from softmax(logits / T), no gradient; written into the ORIGINAL ids
    # (unmask(masked) == ids), so the 15% kept slots are also replaced by samples.
    with torch.no_grad():
        p = F.softmax(logits.detach().float() / cfg.objective.temperature, -1)
        sampled = torch.multinomial(p.flatten(0, 1), 1).view_as(pos)
        fake, hit = scatter_update(ids, sampled, pos)
        labels = (hit & (fake != ids)).float()  # is_fake_tokens
    d_logits = disc(input_ids=fake, attention_mask=am, token_type_ids=seg).logits  # [B, L]
    amf = am.float()
    bce = F.binary_cross_entropy_with_logits(d_logits, labels, reduction="none") * amf
    disc_loss = bce.sum() / (amf.sum() + 1e-6)
    loss = cfg.objective.gen_weight * gen_loss + cfg.objective.disc_weight * disc_loss

    def safe(a, b):  # a ratio, 0 when nothing was counted
        return float(a / b) if b > 0 else 0.0

    with torch.no_grad():
        preds = (d_logits > 0).float()
        correct = (preds == labels).float() * amf
        tp = (correct * preds).sum()
        metrics = dict(
            loss=float(loss),
            gen_loss=float(gen_loss),
            disc_loss=float(disc_loss),
            gen_accuracy=safe((w * (logits.argmax(-1) == target).float()).sum(), w.sum()),
            disc_accuracy=safe(correct.sum(), amf.sum()),
            disc_precision=safe(tp, (preds * amf).sum()),
            disc_recall=safe(tp, (labels * amf).sum()),
            replaced_fraction=safe((labels * amf).sum(), amf.sum()),
        )
    return loss, metrics


# ------------------------------------------------------------------------------------- optimizer
class AdamWeightDecay:
    """optimization.AdamWeightDecayOptimizer: p -= lr * (m/(sqrt(v)+eps) + wd*p), with decay off
    for LayerNorm and bias parameters; with bias_correction, m and v are first divided by
    (1 - b^t) (this equals torch.optim.AdamW); without, the official uncorrected update."""

    def __init__(self, named_params, tc):
        no_decay = ("LayerNorm", "layer_norm", "bias")
        self.slots = [
            (p, not any(k in n for k in no_decay), torch.zeros_like(p), torch.zeros_like(p))
            for n, p in named_params
        ]  # (param, decay?, m, v)
        self.b1, self.b2, self.eps, self.wd = tc.adam_b1, tc.adam_b2, tc.adam_eps, tc.weight_decay
        self.correct, self.t = tc.adam_bias_correction, 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        c1 = 1 - self.b1**self.t if self.correct else 1.0
        c2 = 1 - self.b2**self.t if self.correct else 1.0
        for p, decay, m, v in self.slots:
            if p.grad is None:  # tf.gradients gave None: the official optimizer skips it
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            update = (m / c1) / ((v / c2).sqrt() + self.eps)
            if decay and self.wd > 0:
                update += self.wd * p
            p.sub_(lr * update)


def learning_rate(s, tc, kind):
    """LR of the update made at global_step s (0-based): 0 at s = 0, as in the official."""
    T, W, peak = tc.num_steps, tc.warmup_steps, tc.learning_rate
    warm = min(1.0, s / W) if W > 0 else 1.0
    if kind == "official":  # polynomial_decay(power 1) times the warm-up ramp
        return peak * (1 - min(s, T) / T) * warm
    return peak * warm if s < W else peak * max(0.0, (T - s) / max(1, T - W))


# ------------------------------------------------------------------------------------- main
def main():
    args = parse_args()
    torch.set_num_threads(2)
    if args.config.endswith(".json"):
        with open(args.config) as f:
            cfg = ml_collections.ConfigDict(json.load(f))
    else:
        cfg = runpy.run_path(args.config)["get_config"]()
    if args.source:
        cfg.data.source = args.source
    if args.num_steps:
        cfg.train.num_steps = args.num_steps
    log_every = args.log_every or cfg.log.every_steps
    out_path = args.out or os.path.join(args.workdir, "hf_reference_metrics.jsonl")
    assert cfg.objective.get("name", "electra") == "electra", "only objective 'electra' is here"
    assert cfg.model.get("embedding_sharing", "electra") == "electra"
    torch.manual_seed(cfg.seed)

    # Data, exactly as electra_jax/pretraining/runner.py builds it (reuses WORKDIR's tokenizer
    # and shards).
    tok = shards.ensure_tokenizer(cfg.data, os.path.join(args.workdir, "tokenizer"), cfg.seed)
    cache_dir = cfg.data.cache_dir or os.path.join(args.workdir, "data")
    before = set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()
    prepared = shards.prepare(cfg.data, tok, cache_dir, cfg.seed)
    if os.path.basename(prepared.directory) not in before:
        print(
            f"NOTE: prepared NEW shards {prepared.directory}: no earlier run in this workdir "
            "used this data config, so there are no JAX batches to match",
            file=sys.stderr,
        )
    data_iter = pipeline.make_iterator(
        prepared, cfg.train.batch_size, cfg.seed, process_index=0, process_count=1
    )
    special = dict(pad=tok.pad_id, cls=tok.cls_id, sep=tok.sep_id, mask=tok.mask_id)
    assert special["pad"] == 0, "HF ELECTRA assumes [PAD] = 0"

    disc, gen, both = build_models(cfg, tok.vocab_size)
    both.train()
    named = list(both.named_parameters())  # shared tensors appear once
    opt = AdamWeightDecay(named, cfg.train)
    params = [p for _, p in named]
    N = int((cfg.objective.mask_prob + 0.005) * cfg.data.seq_length)  # max_predictions_per_seq
    print(
        f"prepared {prepared.directory}: {prepared.num_examples} rows; vocab {tok.vocab_size}; "
        f"params {sum(p.numel() for p in params):,}; N={N}; out {out_path}",
        file=sys.stderr,
    )

    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    start = last = time.time()
    last_step = 0  # the last logged step, for the seconds per step since then
    with open(out_path, "w") as out:
        for s in range(cfg.train.num_steps):
            batch = {k: torch.from_numpy(v.astype(np.int64)) for k, v in next(data_iter).items()}
            loss, metrics = electra_step(disc, gen, batch, N, cfg, special)
            for p in params:
                p.grad = None
            loss.backward()
            grads = [p.grad for p in params if p.grad is not None]  # None: skipped, as in TF
            # tf.clip_by_global_norm(grads, 1.0): scale by clip / max(norm, clip).
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            scale = cfg.train.clip_norm / max(float(norm), cfg.train.clip_norm)
            for g in grads:
                g.mul_(scale)
            lr = learning_rate(s, cfg.train, args.schedule)
            opt.step(lr)
            step = s + 1
            if step % log_every == 0 or step == cfg.train.num_steps:
                now = time.time()
                row = dict(
                    step=step,
                    **metrics,
                    learning_rate=lr,
                    grad_norm=float(norm),
                    elapsed_sec=now - start,
                )
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(
                    "step {step} loss {loss:.4f} gen {gen_loss:.4f} (acc {gen_accuracy:.3f}) "
                    "disc {disc_loss:.4f} (acc {disc_accuracy:.3f}) replaced "
                    "{replaced_fraction:.3f} lr {learning_rate:.2e}".format(**row),
                    f"{(now - last) / (step - last_step):.2f}s/step",
                    file=sys.stderr,
                    flush=True,
                )
                last, last_step = now, step
            if not math.isfinite(metrics["loss"]):
                sys.exit(f"non-finite loss at step {step}")


if __name__ == "__main__":
    main()
