"""Is the cross path live? Per direction source → learner, from the warm-start weights, in under a minute.

For any config: every agent samples G responses to the same B training prompts (HF `generate` on the warm-start
checkpoint, the agent's temperature and length limits), the real math-verify scorer rewards them, the real broker
re-encodes each response for every other agent and builds the learners' rows (advantages, ω, length scale), and
each learner scores its rows. `hacpo_loss` then says, row by row, what the first HACPO step would do with them:
each row at the update u the trainer would use (rows in order, `algo.updates_per_step` mini-batches: the cross
rows come last, at the narrower windows lo_u = 1 − δ + u·δ_step), with the warm-start weights throughout. Printed per direction and per length convention (`algo.ratio_length`, docs/algorithm.md §4):

    L_k/L_j      mean token-count ratio of the learner's re-encoding over the source's tokens
    m_j, m_k     median mean token log-prob of the cross responses under the source (sampler) and the learner
    s p10/50/90  quantiles of the cross ratio s
    window       share of cross rows with lo_u ≤ s ≤ 1 (the clip passes gradient)
    grad         share of cross rows with a non-zero gradient (in the window and A ≠ 0)

    python benchmarks/cross_path.py                                       # pair_tiny, 16 prompts × 4 samples
    python benchmarks/cross_path.py --config-name trio_tiny --prompts 32 --json /tmp/cross.json
    python benchmarks/cross_path.py agents.1.rollout.temperature=0.7       # any config override

The warm start must be cached (`python recipes/train.py --config-name <name>` makes it); a missing one is trained
first, which takes minutes. Numbers are one sample of B·G responses: rerun with `--seed` to see their spread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONVENTIONS = ("per_tokenizer", "single_exponent")


def load_agents(cfg):
    """`{agent: (model, tokenizer, AgentConfig)}` from the warm-start (or configured HF) checkpoints."""
    from transformers import AutoModelForCausalLM

    from nemo_hacpo.models.tokenizers import load_tokenizer
    from nemo_hacpo.planning.preflight import check_agents, tokenizer_source
    from nemo_hacpo.runtime.warmstart import ensure_warm_start

    check_agents(cfg)  # before minutes of warm start: tokenizers exist, every tiny model converts to HF
    warm = ensure_warm_start(cfg) if cfg.warmstart.enabled else {}
    out = {}
    for agent in cfg.agents:
        path = warm.get(agent.name) or agent.model.path
        if not path:
            raise SystemExit(f"{agent.name}: no weights to measure (model.source {agent.model.source!r} without a warm "
                             "start or model.path); enable warmstart or give model.path")
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        out[agent.name] = (model, load_tokenizer(tokenizer_source(agent)), agent)
    return out


@torch.no_grad()
def mean_logprobs(model, token_ids: list[list[int]], response_mask: list[list[int]], batch: int = 32) -> list[float]:
    """Mean log-prob of each row's response tokens (the trainer's m, here from the HF model)."""
    out = []
    for first in range(0, len(token_ids), batch):
        ids, masks = token_ids[first:first + batch], response_mask[first:first + batch]
        width = max(map(len, ids))
        input_ids = torch.tensor([row + [0] * (width - len(row)) for row in ids])
        attention = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]  # [b, W-1]
        scored = torch.tensor([mask[1:] + [0] * (width - len(mask)) for mask in masks], dtype=torch.bool)
        sums = torch.where(scored, logp, torch.zeros_like(logp)).sum(-1)
        out += (sums / scored.sum(-1).clamp(min=1)).tolist()
    return out


@torch.no_grad()
def sample(model, tokenizer, agent, prompts: list[list[int]], group: int, seed: int):
    """G responses per prompt: `(response ids without EOS, finished)` in (prompt, sample) order."""
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts]).repeat_interleave(group, 0)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]).repeat_interleave(group, 0)
    temperature = agent.rollout.temperature
    generated = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=temperature > 0,
                               temperature=temperature if temperature > 0 else None, top_p=agent.rollout.top_p,
                               top_k=0, max_new_tokens=agent.max_response_length, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=pad)[:, width:]
    out = []
    for row in generated.tolist():
        if tokenizer.eos_token_id in row:
            out.append((row[:row.index(tokenizer.eos_token_id)], True))
        else:
            out.append((row, False))
    return out


def measure(cfg, prompts: int, group: int, seed: int) -> dict:
    from nemo_hacpo.algo import hacpo_loss
    from nemo_hacpo.broker import AgentRollout, Broker, LearnerTokenizer, Trajectory
    from nemo_hacpo.data.prompts import PromptFormat
    from nemo_hacpo.data.splits import load_split
    from nemo_hacpo.models.chat import render_prompt_ids
    from nemo_hacpo.rewards.scorer import MathRewardScorer
    from nemo_hacpo.runtime.cross_path import direction_metrics
    from nemo_hacpo.training.batching import minibatch_ranges
    from nemo_hacpo.training.loss_metrics import RowOutcome

    start = time.perf_counter()
    agents = load_agents(cfg)
    names = list(agents)
    problems = load_split(cfg.data.train, "train")
    problems = [problems[i] for i in torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed))[
        :prompts].tolist()]
    messages = [tuple(PromptFormat.of(cfg.data, "train").messages(p)) for p in problems]
    rollouts, accuracy = {}, {}
    with MathRewardScorer(num_workers=0, strict=cfg.reward.strict) as scorer:
        for name, (model, tok, agent) in agents.items():
            prompt_ids = [render_prompt_ids(m, tok, agent.tokenizer.chat_template) for m in messages]
            responses = sample(model, tok, agent, prompt_ids, group, seed)
            flat_prompts = [p for p in prompt_ids for _ in range(group)]
            ids = [p + r + ([tok.eos_token_id] if done else []) for p, (r, done) in zip(flat_prompts, responses,
                                                                                      strict=True)]
            masks = [[0] * len(p) + [1] * (len(i) - len(p)) for p, i in zip(flat_prompts, ids, strict=True)]
            texts = [tok.decode(r, skip_special_tokens=True) for r, _ in responses]
            rewards = scorer.score(texts, [problems[n // group].answer for n in range(len(texts))]).rewards
            m_old = mean_logprobs(model, ids, masks)
            rows = []
            for n, ((_, done), text) in enumerate(zip(responses, texts, strict=True)):
                b = n // group
                trajectory = Trajectory(
                    prompt_id=problems[b].id, messages=messages[b], response_text=text, source=name,
                    sample_index=n % group, finish_reason="stop" if done else "length", reward=float(rewards[n]),
                    source_mean_logprob=m_old[n], source_num_tokens=sum(masks[n]), gold=problems[b].answer)
                rows.append(AgentRollout(trajectory, ids[n], masks[n]))
            rollouts[name] = rows
            accuracy[name] = sum(rewards) / len(rewards)
    learners = {name: LearnerTokenizer(tok, agent.max_response_length, agent.tokenizer.chat_template)
                for name, (_, tok, agent) in agents.items()}
    algo, spec = cfg.algo, cfg.algo.algorithm
    results: dict = {"config": cfg.runtime.output_dir, "prompts": prompts, "group": group, "seed": seed,
                     "accuracy": accuracy, "directions": {}}
    for convention in CONVENTIONS:
        step = Broker(names, learners, algorithm=spec, adv_eps=algo.adv_eps, ratio_length=convention).step(rollouts)
        for k, learner in enumerate(names):
            rows = step.rows[learner]
            m_k = torch.tensor(mean_logprobs(agents[learner][0], rows.token_ids, rows.response_mask),
                               dtype=torch.float64)
            pieces: dict[str, list] = {"ratio": [], "in_window": [], "gradient": []}
            for u, part in enumerate(minibatch_ranges(len(rows), algo.updates_per_step)):  # each row at its own u
                index = torch.tensor(list(part))
                rows_out: dict = {}
                hacpo_loss((m_k * rows.ratio_length_scale.double())[index], rows.old_mean_logprob.double()[index],
                           rows.advantages.double()[index], rows.cross_objective[index], rows.omega.double()[index],
                           u, alpha=algo.alpha, delta=algo.delta, delta_step=algo.delta_step, eps_low=algo.eps_low,
                           eps_high=algo.eps_high, max_abs_log_ratio=algo.max_abs_log_ratio,
                           cross_clip=algo.ablation.cross_clip, rows_out=rows_out)
                for key in pieces:
                    pieces[key] += rows_out[key].tolist()
            outcome = RowOutcome(tuple(pieces["ratio"]), tuple(pieces["in_window"]), tuple(pieces["gradient"]))
            stats = direction_metrics(learner, names, rows.source, ~rows.is_own, outcome, rows.advantages)
            own = ~rows.cross_objective & (rows.source == k)
            results.setdefault("own_ratio_max_dev", {})[learner] = float(
                (torch.tensor(outcome.ratio)[own] - 1).abs().max())
            for j, source in enumerate(names):
                if j == k:
                    continue
                cross = rows.cross_objective & (rows.source == j)
                if not bool(cross.any()):
                    continue
                entry = results["directions"].setdefault(f"{source} → {learner}", {})
                prefix = f"{learner}/from/{source}/"
                entry[convention] = {key[len(prefix):]: value for key, value in stats.items() if key.startswith(prefix)}
                lengths = torch.tensor([sum(m) for m in rows.response_mask])[cross].double()
                source_lengths = torch.tensor([r.trajectory.source_num_tokens for r in rollouts[source]]).double()
                entry["length_ratio"] = float(lengths.sum() / source_lengths.sum())
                entry["m_source_p50"] = float(rows.old_mean_logprob[cross].double().median())
                entry["m_learner_p50"] = float(m_k[cross].median())
    results["elapsed_s"] = time.perf_counter() - start
    return results


def print_table(results: dict) -> None:
    acc = ", ".join(f"{a} {v:.3f}" for a, v in results["accuracy"].items())
    print(f"# cross path from the warm start (each row at its update u): {results['prompts']} prompts × {results['group']} samples, "
          f"seed {results['seed']}; sample accuracy {acc}; {results['elapsed_s']:.0f} s")
    print("| direction | L_k/L_j | m_j p50 | m_k p50 | convention | s p10 / p50 / p90 | window | grad |")
    print("|---|---|---|---|---|---|---|---|")
    for direction, entry in results["directions"].items():
        for convention in CONVENTIONS:
            if convention not in entry:
                continue
            e = entry[convention]
            print(f"| {direction} | {entry['length_ratio']:.3f} | {entry['m_source_p50']:.3f} | "
                  f"{entry['m_learner_p50']:.3f} | {convention} | {e['s_p10']:.3g} / {e['s_p50']:.3g} / "
                  f"{e['s_p90']:.3g} | {e['in_window_frac']:.2f} | {e['grad_frac']:.2f} |")
    worst = max(results["own_ratio_max_dev"].values())
    print(f"(own rows: max |s − 1| = {worst:.1e}, the learner scoring its own samples)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="pair_tiny")
    parser.add_argument("--prompts", type=int, default=16, help="B: training prompts")
    parser.add_argument("--group", type=int, default=4, help="G: samples per prompt and agent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    from nemo_hacpo.config import load_config

    cfg = load_config(args.config_name, args.overrides)
    if len(cfg.agents) < 2:
        raise SystemExit("the cross path needs ≥ 2 agents")
    results = measure(cfg, args.prompts, args.group, args.seed)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
