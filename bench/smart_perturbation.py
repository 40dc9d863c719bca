"""Not a speed benchmark: SMART's adversarial term R_s and its perturbation in the two modes.

One batch per task (the first bucketed batch of each in the epoch-0 schedule, as in smart_cost.py),
the pretrained encoder with fresh heads, dropout off, the perturbation at the embedding output (the
trainer's default --smart-perturb-at). For each task and mode (paper, reference) it prints R_s, the
mean and max per-token l_inf norm of delta over real (non-padding) tokens, and for the reference
mode how far the ascent step moved delta from the normalised starting noise (1 - cosine between
delta and noise / (||noise||_token + norm_eps), over real tokens): near 0 means delta is the noise.

    python bench/smart_perturbation.py --threads 1
"""
from __future__ import annotations

import dataclasses
import platform

import torch
from common import data_parser  # noqa: E402  (puts the repository on sys.path)
from smart_cost import task_batches  # noqa: E402

from heads import KIND  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.smart import SmartConfig, adversarial_loss, dropout_disabled, perturb  # noqa: E402
from training.run.build import build_model  # noqa: E402


def parse_args(argv=None):
    p = data_parser(__doc__)
    p.add_argument("--batch-size", type=int, default=32, help="examples per task batch (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=11711, help="schedule, head and noise seed (default: %(default)s)")
    p.add_argument("--smart-steps", type=int, default=1, help="K, SMART's ascent steps (default: %(default)s)")
    p.add_argument("--step-size", type=float, default=SmartConfig.step_size,
                   help="eta, the ascent step (default: %(default)s)")
    return p.parse_args(argv)


def real_tokens(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return t[mask.bool()]  # (tokens, H)


def measure(model, batch, cfg: SmartConfig, seed: int) -> dict:
    masks = [s["attention_mask"] for s in batch.inputs]
    kind = KIND[batch.task]

    def f(xs):
        return model.from_hidden(batch.task, list(xs), masks, 0)

    with dropout_disabled(model):
        hs = tuple(h.detach().float() for h in model.hidden_at(batch.inputs, 0))
        with torch.no_grad():
            clean = f(hs)
        deltas = perturb(f, hs, clean, kind, cfg, masks, torch.Generator().manual_seed(seed))
        r_s = adversarial_loss(f, hs, clean, kind, cfg, masks, torch.Generator().manual_seed(seed)).item()
    d = torch.cat([real_tokens(x, m) for x, m in zip(deltas, masks)])
    row = {"r_s": r_s, "mean_linf": d.abs().amax(-1).mean().item(), "max_linf": d.abs().amax().item()}
    if cfg.perturbation == "reference":
        gen = torch.Generator().manual_seed(seed)
        noise = [torch.randn(h.shape, generator=gen) * cfg.noise_std for h in hs]  # the draws perturb makes
        n = torch.cat([real_tokens(x, m) for x, m in zip(noise, masks)])
        n = n / (n.abs().amax(-1, keepdim=True) + cfg.norm_eps)
        row["moved"] = 1 - torch.nn.functional.cosine_similarity(d, n, dim=-1).mean().item()
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device="cpu",
                      seed=args.seed)
    model, tokenizer, _ = build_model(cfg)
    model.train()
    batches = task_batches(cfg, tokenizer)
    base = SmartConfig(steps=args.smart_steps, step_size=args.step_size)
    print(f"# SMART perturbation: {args.model}, one batch per task, K={args.smart_steps}, eta={args.step_size}, "
          f"noise_std={base.noise_std}, eps={base.eps} (paper), norm_eps={base.norm_eps} (reference), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}")
    print(f"{'task':<6}{'mode':<11}{'R_s':>11}{'mean |d|_inf':>14}{'max |d|_inf':>13}{'1 - cos(d, noise)':>19}")
    for batch in batches:
        for mode in ("paper", "reference"):
            row = measure(model, batch, dataclasses.replace(base, perturbation=mode), args.seed)
            moved = f"{row['moved']:>19.2e}" if "moved" in row else f"{'':>19}"
            print(f"{batch.task:<6}{mode:<11}{row['r_s']:>11.3e}{row['mean_linf']:>14.3e}{row['max_linf']:>13.3e}{moved}")


if __name__ == "__main__":
    main()
