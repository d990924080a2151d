"""A short supervised warm start, so RL starts at a reward of ~0.2-0.5 rather than 0.

Teacher-forced cross-entropy on reference answers (a multi-turn task: on the policy's tokens of the reference
call and answer, the observation and padding as context only) until the *sampled* reward of the inference
path reaches ``target_reward`` (checked every ``eval_every`` steps) or ``max_steps``. Cached per
(model, task, seed) under ``<home>/.cache/warmstart/`` (``harness.uri.home``: the project root in a checkout) so every estimator of a comparison starts from
the same weights. A cache file is read as tensors and plain values only (``harness.torchfile``: one naming code is
refused, not run); one that cannot be read (truncated, crafted, another layout) is named in a warning and made
again; one that cannot be written (disk full) is named in a warning and the run goes on uncached.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from harness.backends.local import train_engine
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import Policy, build_policy
from harness.backends.local.tasks import Task
from harness import numerics, torchfile
from harness.backends.local.identity import LOCAL_NUMERICS
from harness.spec import InferenceConfig, ModelConfig, TaskConfig
from harness.uri import home

#: the cache folder; None = ``<home>/.cache/warmstart`` read at each use (tests point it elsewhere)
CACHE: Path | None = None


def cache_dir() -> Path:
    return CACHE if CACHE is not None else home() / ".cache" / "warmstart"


def cache_path(mcfg: ModelConfig, tcfg: TaskConfig, seed: int) -> Path:
    # the numerics fingerprint's key (harness/numerics.py): a cache computed by another torch is never read
    key = json.dumps({"model": asdict(mcfg), "task": asdict(tcfg), "seed": seed, "numerics": LOCAL_NUMERICS,
                      "fingerprint": numerics.fingerprint()["key"]}, sort_keys=True)
    return cache_dir() / f"{mcfg.name}-{tcfg.name}-s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.pt"


@torch.no_grad()
def sampled_reward(policy: Policy, task: Task, gen: torch.Generator, n: int = 128) -> float:
    """The mean reward of n responses sampled in float32 (a multi-turn task: through the inference engine's
    multi-turn rollout in float32, deterministic, noiseless, its keyed sampling seeded from ``gen``)."""
    prompts, answers = task.sample(n, gen)
    if task.multi_turn:
        key = int(torch.randint(0, 2**31 - 1, (), generator=gen))  # a fresh key per evaluation, from ``gen``
        engine = InferenceEngine(policy, InferenceConfig(dtype="float32", deterministic=True, batch_variance=False,
                                                         router_noise_sigma=0.0), key)
        tokens = task.rollout(engine, prompts).tokens
        return task.reward(task.final(tokens), answers)[0].mean().item()
    tokens = prompts
    for _ in range(task.answer_len):  # plain float32 sampling from the training forward
        logits = train_engine.forward(policy, tokens).logits[:, -1]
        tokens = torch.cat([tokens, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], 1)
    return task.reward(tokens[:, task.prompt_len:], answers)[0].mean().item()


@torch.enable_grad()
def warm_start(mcfg: ModelConfig, tcfg: TaskConfig, seed: int, use_cache: bool = True,
               progress: bool = True) -> tuple[Policy, dict]:
    """Returns the warm-started float32 policy and a record {steps, reward}. When not cached it says so
    on stderr, shows a bar on a terminal, and prints its steps, reward and time at the end."""
    numerics.check()
    path = cache_path(mcfg, tcfg, seed)
    if use_cache and path.exists():
        cached = _from_cache(path, mcfg, seed)
        if cached is not None:
            return cached
    policy = build_policy(mcfg, seed)
    ws, task = tcfg.warmstart, Task(tcfg)
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    opt = torch.optim.AdamW(policy.parameters(), lr=ws.lr, weight_decay=0.0)
    reward, step = sampled_reward(policy, task, gen), 0
    t0 = time.monotonic()
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)  # noqa: E731
    say(f"warm start of {mcfg.name} on {tcfg.name} (seed {seed}, not cached yet): supervised steps until the "
        f"sampled reward reaches {ws.target_reward} (at most {ws.max_steps})")
    bar = tqdm(total=ws.max_steps, desc="warm start", leave=False, dynamic_ncols=True,
               disable=not (progress and sys.stderr.isatty()))
    while reward < ws.target_reward and step < ws.max_steps:
        for _ in range(ws.eval_every):
            prompts, answers = task.sample(ws.batch_size, gen)
            response, targets = task.teacher(prompts, answers)  # targets -100: context, not loss (multi-turn)
            tokens = torch.cat([prompts, response], 1)
            logits = train_engine.forward(policy, tokens).logits[:, task.prompt_len - 1:-1]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        reward = sampled_reward(policy, task, gen)
        bar.update(ws.eval_every)
        bar.set_postfix(reward=f"{reward:.3f}")
    bar.close()
    say(f"warm start done: {step} steps, sampled reward {reward:.3f}, {time.monotonic() - t0:.0f} s (cached in {path.parent})")
    record = {"steps": step, "reward": reward}
    if use_cache:
        _to_cache(path, policy, record)
    return policy, record


def _from_cache(path: Path, mcfg: ModelConfig, seed: int) -> tuple[Policy, dict] | None:
    """The cached (policy, record), or None with a warning naming ``path`` when it cannot be used (then the
    warm start runs again and replaces it): a corrupt cache must not break every run of its (model, task, seed)."""
    try:
        blob = torchfile.load(path)  # tensors and plain values: a crafted file is refused, not run
        record = blob.get("record") if isinstance(blob, dict) else None
        if not isinstance(record, dict) or not {"steps", "reward"} <= record.keys() or "state" not in blob:
            raise ValueError("not a warm-start cache: no state and record {steps, reward}")
        policy = build_policy(mcfg, seed)
        policy.load_state_dict(blob["state"])
    except Exception as exc:  # noqa: BLE001 - truncated, crafted, another layout: made again
        _warn(f"warm-start cache {path} cannot be read ({torchfile.cause(exc)}): warming up again, then replacing it")
        return None
    return policy, record


def _to_cache(path: Path, policy: Policy, record: dict) -> None:
    """Cache the warm start (atomically: concurrent runs may warm-start the same model); a failed write is a
    warning naming the path, and the run goes on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torchfile.save({"state": policy.state_dict(), "record": record}, path)
    except torchfile.WriteFailed as exc:
        _warn(f"warm start not cached ({exc}); the next run of this model, task and seed warms up again")
    except OSError as exc:
        _warn(f"warm start not cached (cannot create {path.parent}: {torchfile.cause(exc)}); the next run of this "
              f"model, task and seed warms up again")


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)
