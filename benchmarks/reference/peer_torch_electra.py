#!/usr/bin/env python
"""PEER baseline: one ELECTRA pre-training step (Small, Base or Large), PyTorch + HF transformers,
on the CPU or an NVIDIA GPU.

Mirrors google-research/electra (run_pretraining.py, pretrain/pretrain_helpers.py,
model/optimization.py, configure_pretraining.py) as closely as the HF modules allow:

  * discriminator: ElectraForPreTraining, --size (util/training_utils.get_bert_config: heads =
    H // 64, FF = 4 x H; embedding size from configure_pretraining.py and its comments / Table 6):
      small (default): E=128,  H=256,  12 layers,  4 heads, FF=1024
      base:            E=768,  H=768,  12 layers, 12 heads, FF=3072
      large:           E=1024, H=1024, 24 layers, 16 heads, FF=4096
  * generator:     ElectraForMaskedLM, run_pretraining.get_generator_config: hidden =
    round(frac x disc H), frac 0.25 (small, large) or 0.33333 (base); as many layers as the
    discriminator; heads = max(1, hidden // 64); FF = 4 x hidden; the same E:
      small: H=64, 1 head, FF=256;  base and large: H=256, 4 heads, FF=1024
  * generator and discriminator share the whole embeddings block (word, position,
    token-type embeddings + embedding LayerNorm == the official "electra/embeddings"
    variable scope); each keeps its own embeddings_project (E -> H, which exists only where
    E != H: both models for small, the generator alone for base and large); the generator's
    output layer is tied to the shared word embeddings (+ its own output bias).
  * masking == pretrain_helpers.mask: N = int((mask_prob+0.005)*L) slots, mask_prob 0.15 (small,
    base) or 0.25 (large), num_to_predict = max(1, min(N, round(mask_prob * n_tokens))),
    positions drawn with replacement from the uniform distribution over non-special tokens,
    85% of them -> [MASK], 15% kept as the original token (no 10% random-token branch as in BERT).
  * generator MLM cross-entropy on the gathered masked positions only (the vocab
    projection runs on B x N rows, not B x L, as in the official get_token_logits).
  * replacements sampled from softmax(logits / T), T = 1, with Gumbel noise (default) or
    torch.multinomial, under no_grad; scatter_update semantics ported (position 0
    ignored, duplicates averaged by floor-division) ; labels = masked & (corrupt != orig).
  * discriminator BCE on all non-padding tokens; total = 1.0 * gen + 50.0 * disc.
  * AdamW(lr 5e-4 small, 2e-4 base and large, betas (0.9, 0.999), eps 1e-6, wd 0.01, no decay on
    LayerNorm / bias), linear warm-up 10k / linear decay to 1M steps, global-norm grad clip 1.0.

Device, precision, compilation (defaults: cpu, float32, not compiled):
  * --device cuda: models, inputs and every tensor the step creates live on the GPU; each timed
    step is bracketed by torch.cuda.synchronize(). --threads sets CPU threads on cpu only.
  * --dtype bfloat16: the usual AMP recipe: forward and losses under torch.autocast(bfloat16),
    parameters, gradients and AdamW state in float32, no GradScaler; the generator logits are cast
    to float32 for the log-softmax and the Gumbel sampling (CUDA autocast does the former anyway).
  * --compile: torch.compile (default mode, in place) on the modules the step calls: the
    generator's encoder and prediction head, and the whole discriminator (the vocabulary matmul
    and the losses stay eager); compilation happens in the untimed warm-up steps. On a busy
    CPU, set OMP_WAIT_POLICY=PASSIVE: the compiled kernels' OpenMP spin-waits can otherwise
    slow a step many times over.
  * flops_per_step = 3 x forward matmul FLOPs (a multiply-add = 2 FLOPs) of both encoders over all
    B x L tokens (q, k, v, o projections, QK^T, PV, FFN), the embedding projections where E != H,
    the generator head (dense + vocabulary projection) at the B x N masked slots only and the
    discriminator head (H x H + H x 1) over all tokens; tflops_per_sec = flops_per_step / median.

Usage:
  python peer_torch_electra.py --batch 32 --seq 128 --steps 20 --warmup 3
  python peer_torch_electra.py --configs 32x128,8x512 --steps 20 --warmup 3   # a process each
  python peer_torch_electra.py --device cuda --dtype bfloat16 --size base --batch 64 --seq 512 \
      --steps 10 --warmup 5 --compile
Prints one JSON line per configuration at the end (progress goes to stderr).
"""

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

CLS_ID, SEP_ID, MASK_ID, PAD_ID = 101, 102, 103, 0
VOCAB = 30522


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- models
# discriminator hidden size and layers (training_utils.get_bert_config), embedding size, generator
# hidden fraction, mask_prob and learning rate (configure_pretraining.py and its comments)
SIZES = {
    "small": dict(hidden=256, layers=12, embedding=128, gen_frac=0.25, mask_prob=0.15, lr=5e-4),
    "base": dict(hidden=768, layers=12, embedding=768, gen_frac=0.33333, mask_prob=0.15, lr=2e-4),
    "large": dict(hidden=1024, layers=24, embedding=1024, gen_frac=0.25, mask_prob=0.25, lr=2e-4),
}


def build_models(attn_impl, size="small", device="cpu"):
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    sz = SIZES[size]
    common = dict(
        vocab_size=VOCAB,
        embedding_size=sz["embedding"],
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=PAD_ID,
    )
    # get_bert_config: heads = max(1, H // 64), intermediate = 4 * H (small: 4 heads, FF 1024)
    H = sz["hidden"]
    disc_cfg = ElectraConfig(
        hidden_size=H,
        num_hidden_layers=sz["layers"],
        num_attention_heads=max(1, H // 64),
        intermediate_size=4 * H,
        **common,
    )
    # official get_generator_config: hidden = round(frac * H) (small: 64, base and large: 256),
    # layers = 1.0 * disc layers, intermediate = 4 * hidden, heads = max(1, hidden // 64)
    Hg = int(round(H * sz["gen_frac"]))
    gen_cfg = ElectraConfig(
        hidden_size=Hg,
        num_hidden_layers=sz["layers"],
        num_attention_heads=max(1, Hg // 64),
        intermediate_size=4 * Hg,
        **common,
    )
    for c in (disc_cfg, gen_cfg):
        c._attn_implementation = attn_impl
    disc = ElectraForPreTraining(disc_cfg)
    gen = ElectraForMaskedLM(gen_cfg)

    # share the embeddings block (word/pos/type tables + embedding LayerNorm), as the
    # official code puts both under the "electra/embeddings" scope
    gen.electra.embeddings = disc.electra.embeddings
    # generator output layer tied to the (shared) input word embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    # initialised on the CPU (same weights for every device), then moved; Module.to keeps the
    # Parameter objects, so the sharing and the tie survive (checked below)
    disc.to(device)
    gen.to(device)
    assert (
        gen.generator_lm_head.weight.data_ptr()
        == disc.electra.embeddings.word_embeddings.weight.data_ptr()
    )
    assert gen.electra.embeddings is disc.electra.embeddings
    return gen, disc


def n_params(module_list):
    seen, n = set(), 0
    for m in module_list:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
    return n


def count_flops(disc_cfg, gen_cfg, B, L, N):
    """Training FLOPs of one step = 3 x forward matmul FLOPs (a multiply-add = 2 FLOPs)."""
    T, E, V = B * L, disc_cfg.embedding_size, disc_cfg.vocab_size

    def encoder(c):  # multiply-adds over all B x L tokens
        H, FF = c.hidden_size, c.intermediate_size
        per_layer = T * (4 * H * H + 2 * H * FF) + 2 * B * L * L * H  # q,k,v,o + FFN; QK^T + PV
        return c.num_hidden_layers * per_layer + (T * E * H if E != H else 0)  # embeddings_project

    Hd, Hg = disc_cfg.hidden_size, gen_cfg.hidden_size
    macs = (
        encoder(disc_cfg)
        + encoder(gen_cfg)
        + B * N * (Hg * E + E * V)  # generator head (dense + vocabulary) at the masked slots
        + T * (Hd * Hd + Hd)
    )  # discriminator head (dense + 1-unit output) on all tokens
    return 3 * 2 * macs


def check_compile(device):
    """Fail early, with a clear message, where torch.compile cannot build kernels (no C++
    compiler for CPU inductor, no Triton or C compiler for CUDA) rather than deep in step one."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(8, device=device))
    except Exception as e:  # noqa: BLE001 - any backend failure means the same thing here
        msg = [ln for ln in str(e).splitlines() if ln.strip()]
        sys.exit(
            f"[peer] --compile: torch.compile does not work on this machine ({device}): "
            f"{type(e).__name__}: {msg[0] if msg else ''}\n"
            "[peer] run without --compile, or install what is missing"
        )


# ------------------------------------------------------------ official-style helpers
def scatter_update(sequence, updates, positions):
    """Port of pretrain_helpers.scatter_update for int [B, L] sequences."""
    B, L = sequence.shape
    dev = sequence.device
    flat_pos = (positions + L * torch.arange(B, device=dev).unsqueeze(-1)).reshape(-1)
    upd = torch.zeros(B * L, dtype=sequence.dtype, device=dev).index_add_(
        0, flat_pos, updates.reshape(-1).to(sequence.dtype)
    )
    cnt = torch.zeros(B * L, dtype=sequence.dtype, device=dev).index_add_(
        0, flat_pos, torch.ones_like(flat_pos)
    )
    upd, cnt = upd.view(B, L), cnt.view(B, L)
    cnt[:, 0] = 0  # updates to index 0 are ignored
    upd = torch.div(upd, cnt.clamp(min=1), rounding_mode="floor")  # duplicates
    m = cnt.clamp(max=1)
    return (1 - m) * sequence + m * upd, m


def mask_inputs(input_ids, input_mask, mask_prob, N):
    """Port of pretrain_helpers.mask (uniform proposal, no already_masked)."""
    B, L = input_ids.shape
    dev = input_ids.device
    cand = input_mask.bool()
    for sid in (SEP_ID, CLS_ID, MASK_ID):
        cand &= input_ids != sid
    num_tokens = input_mask.sum(-1).float()
    num_to_predict = torch.round(num_tokens * mask_prob).long().clamp(max=N).clamp(min=1)
    # [B, N]
    weights = (torch.arange(N, device=dev).unsqueeze(0) < num_to_predict.unsqueeze(1)).long()
    sample_prob = cand.float()
    sample_prob = sample_prob / sample_prob.sum(-1, keepdim=True)
    # tf.random.categorical(logits, N) == N independent draws, i.e. WITH replacement
    positions = torch.multinomial(sample_prob, N, replacement=True) * weights
    masked_lm_ids = torch.gather(input_ids, 1, positions) * weights
    replace_with_mask = positions * (torch.rand(B, N, device=dev) < 0.85).long()
    masked_ids, _ = scatter_update(
        input_ids, torch.full((B, N), MASK_ID, device=dev), replace_with_mask
    )
    return masked_ids, positions, masked_lm_ids, weights.float()


# --------------------------------------------------------------------------- step
def make_step(gen, disc, opt, sched, params, args, N, mask_prob):
    def autocast():  # --dtype bfloat16: AMP; float32: no context at all (unchanged behaviour)
        if args.dtype == "bfloat16":
            return torch.autocast(device_type=args.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(input_ids, input_mask, segment_ids):
        with autocast():
            masked_ids, positions, mlm_ids, mlm_w = mask_inputs(input_ids, input_mask, mask_prob, N)

            # generator: encoder on the masked input, head only on the gathered positions
            h = gen.electra(
                input_ids=masked_ids, attention_mask=input_mask, token_type_ids=segment_ids
            )[0]
            rel = torch.gather(h, 1, positions.unsqueeze(-1).expand(-1, -1, h.size(-1)))
            logits = gen.generator_lm_head(gen.generator_predictions(rel))  # [B, N, V]
            # .float(): a no-op in float32; in bfloat16 the log-softmax runs in float32 on every
            # device (CUDA autocast would do so by itself, CPU autocast would not)
            logp = F.log_softmax(logits.float(), -1)
            nll = -torch.gather(logp, -1, mlm_ids.unsqueeze(-1)).squeeze(-1)
            gen_loss = (mlm_w * nll).sum() / (mlm_w.sum() + 1e-6)

            # sample fakes, no gradient through the sample (Gumbel noise in float32)
            with torch.no_grad():
                lg = logits.detach().float() / args.temperature
                if args.sampler == "gumbel":
                    u = torch.rand_like(lg)
                    g = -torch.log(-torch.log(u + 1e-9) + 1e-9)
                    sampled = torch.argmax(lg + g, -1)  # == argmax(softmax(lg + g))
                else:
                    probs = F.softmax(lg, -1).view(-1, lg.size(-1))
                    sampled = torch.multinomial(probs, 1).view(lg.shape[:-1])
                # unmask(masked_ids) == input_ids exactly, so start from the originals
                corrupted, updated = scatter_update(input_ids, sampled, positions)
                labels = (updated * (corrupted != input_ids).long()).float()

            d_logits = disc(
                input_ids=corrupted, attention_mask=input_mask, token_type_ids=segment_ids
            ).logits  # [B, L]
            w = input_mask.float()
            bce = F.binary_cross_entropy_with_logits(d_logits, labels, reduction="none")
            disc_loss = (bce * w).sum() / (w.sum() + 1e-6)

            total = 1.0 * gen_loss + 50.0 * disc_loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        return gen_loss.item(), disc_loss.item(), labels.sum().item() / w.sum().item()

    return step


def run_one(args):
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    import transformers

    if args.compile:
        check_compile(args.device)
    sz = SIZES[args.size]
    gen, disc = build_models(args.attn, args.size, args.device)
    gen.train()
    disc.train()
    if args.compile:
        # in place (nn.Module.compile): parameter names, sharing and tying stay as they are. The
        # step calls the generator's encoder and prediction head directly (not its forward), so
        # those are compiled; the discriminator through its forward.
        for m in (gen.electra, gen.generator_predictions, disc):
            m.compile()

    # unique parameters, official weight-decay exclusion by name
    seen, decay, no_decay, all_params = set(), [], [], []
    for m in (disc, gen):
        for name, p in m.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            all_params.append(p)
            (
                no_decay if any(s in name for s in ("LayerNorm", "layer_norm", "bias")) else decay
            ).append(p)
    adam_kw = {}
    if args.adamw_impl == "foreach":
        adam_kw["foreach"] = True
    elif args.adamw_impl == "fused":
        adam_kw["fused"] = True
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=sz["lr"],
        betas=(0.9, 0.999),
        eps=1e-6,
        **adam_kw,
    )
    warm, total_steps = 10000, 1_000_000
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, s / warm) * max(0.0, 1.0 - s / total_steps)
    )

    B, L = args.batch, args.seq
    N = int((sz["mask_prob"] + 0.005) * L)  # official max_predictions_per_seq
    step = make_step(gen, disc, opt, sched, all_params, args, N, sz["mask_prob"])
    dev = torch.device(args.device)

    def batch():
        ids = torch.randint(1000, 30000, (B, L), device=dev)
        ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
        return (
            ids,
            torch.ones(B, L, dtype=torch.long, device=dev),
            torch.zeros(B, L, dtype=torch.long, device=dev),
        )

    def sync():  # GPU work is asynchronous: wait for it before reading the clock
        if dev.type == "cuda":
            torch.cuda.synchronize()

    log(
        f"[peer] B={B} L={L} N={N} threads={torch.get_num_threads()}"
        f" attn={disc.config._attn_implementation}"
        f" size={args.size} device={args.device} dtype={args.dtype} compile={args.compile}"
    )
    for i in range(args.warmup):
        sync()
        t0 = time.perf_counter()
        out = step(*batch())
        sync()
        log(
            f"[peer] warmup {i}: {time.perf_counter() - t0:.3f}s gen={out[0]:.3f} disc={out[1]:.3f}"
        )
    times = []
    for i in range(args.steps):
        b = batch()  # input generation is outside the timed region
        sync()
        t0 = time.perf_counter()
        out = step(*b)
        sync()
        times.append(time.perf_counter() - t0)
        log(
            f"[peer] step {i}: {times[-1]:.3f}s gen={out[0]:.3f} disc={out[1]:.3f} "
            f"fake_frac={out[2]:.4f}"
        )

    med = statistics.median(times)
    emb = disc.electra.embeddings
    flops = count_flops(disc.config, gen.config, B, L, N)
    res = {
        "framework": "pytorch+hf-transformers (peer)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "nproc": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "attn_impl": disc.config._attn_implementation,
        "sampler": args.sampler,
        "adamw_impl": args.adamw_impl,
        "batch": B,
        "seq": L,
        "max_predictions_per_seq": N,
        "warmup": args.warmup,
        "steps": args.steps,
        "median_s_per_step": round(med, 4),
        "mean_s_per_step": round(statistics.mean(times), 4),
        "min_s_per_step": round(min(times), 4),
        "max_s_per_step": round(max(times), 4),
        "tokens_per_s": round(B * L / med, 1),
        "gen_params_fp32": n_params([gen]),
        "gen_params_excl_shared_emb": n_params([gen]) - n_params([emb]),
        "disc_params_fp32": n_params([disc]),
        "shared_embedding_params": n_params([emb]),
        "unique_params_total": n_params([gen, disc]),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "last_gen_loss": round(out[0], 4),
        "last_disc_loss": round(out[1], 4),
        "last_fake_token_frac": round(out[2], 4),
        # added with --device / --dtype / --size / --compile (all keys above are unchanged)
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "size": args.size,
        "dtype": args.dtype,
        "compiled": args.compile,
        "mask_prob": sz["mask_prob"],
        "learning_rate": sz["lr"],
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "flops_per_step": flops,
        "tflops_per_sec": round(flops / med / 1e12, 4),
        "peak_gpu_mem_mib": (
            round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None
        ),
    }
    return res


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument(
        "--configs",
        default=None,
        help="comma list of BxL, e.g. 32x128,8x512; each runs in its own process",
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--sampler", choices=["gumbel", "multinomial"], default="gumbel")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--adamw-impl", choices=["default", "foreach", "fused"], default="default")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="bfloat16: autocast forward and losses, float32 parameters and optimizer",
    )
    ap.add_argument("--size", choices=list(SIZES), default="small")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the generator and discriminator (compiles in the warm-up)",
    )
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch.cuda.is_available() is False (CPU-only torch, or no GPU)")
    if args.compile and args.warmup < 1:
        ap.error("--compile needs --warmup >= 1, or the compilation would be timed")

    if args.configs:
        lines = []
        for spec in args.configs.split(","):
            b, seq = spec.lower().split("x")
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--batch",
                b,
                "--seq",
                seq,
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--threads",
                str(args.threads),
                "--seed",
                str(args.seed),
                "--temperature",
                str(args.temperature),
                "--sampler",
                args.sampler,
                "--attn",
                args.attn,
                "--adamw-impl",
                args.adamw_impl,
                "--device",
                args.device,
                "--dtype",
                args.dtype,
                "--size",
                args.size,
            ]
            cmd += ["--compile"] if args.compile else []
            out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True).stdout
            lines.append(out.strip().splitlines()[-1])
        for ln in lines:
            print(ln)
    else:
        print(json.dumps(run_one(args)))


if __name__ == "__main__":
    main()
