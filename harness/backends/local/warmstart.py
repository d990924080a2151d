"""A short supervised warm start, so RL starts at a reward of ~0.2-0.5 rather than 0.

Teacher-forced cross-entropy on reference answers (a multi-turn task: on the policy's tokens of the reference
call and answer, the observation and padding as context only) until the *sampled* reward of the inference
path reaches ``target_reward`` (checked every ``eval_every`` steps) or ``max_steps``. Cached per
(model, task, seed) under ``<home>/.cache/warmstart/`` (``harness.uri.home``: the project root in a checkout) so every estimator of a comparison starts from
the same weights. A cache file is read as tensors and plain values only (``harness.torchfile``: one naming code is
refused, not run); one that cannot be read (truncated, crafted, another layout) is named in a warning and made
again; one that cannot be written (disk full) is named in a warning and the run goes on uncached.

A seed pack sets up in bulk (:func:`warm_start_pack`, issue 41 item 2): the cached seeds are read without building
their random initial weights first, and the missing ones warm up *together*, as one pack on the run's device: one
forward and backward per supervised step for all of them, one forward per sampled token of the reward check, and
AdamW's update over the stacked weights (torch's own functional ``adam``, the same ops as ``torch.optim.AdamW``). On
the CPU each seed's result is bitwise its warm start alone (``tests/backends/local/test_warmstart.py``), so the
cache and every stored run stay valid; what stays per seed is only what a seed's own ``torch.Generator`` draws (its
initial weights, prompts and sampled tokens, in the order the warm start alone draws them) and its loss's mean.
A seed that reaches the target reward leaves the pack (its weights are kept as they were then). On another device
the pack computes in that device's arithmetic: its cache files carry the device in their key, so a CPU run never
reads a GPU's warm start. A multi-turn task warms up seed by seed (its reward check runs the inference engine).
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
from torch.optim.adam import adam as adam_step
from tqdm import tqdm

from harness.backends.local import train_engine
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import Policy, PolicyPack, build_policy
from harness.backends.local.tasks import Task
from harness import numerics, torchfile
from harness.backends.local.identity import LOCAL_NUMERICS
from harness.spec import InferenceConfig, ModelConfig, TaskConfig
from harness.uri import home

#: the cache folder; None = ``<home>/.cache/warmstart`` read at each use (tests point it elsewhere)
CACHE: Path | None = None


def cache_dir() -> Path:
    return CACHE if CACHE is not None else home() / ".cache" / "warmstart"


def cache_path(mcfg: ModelConfig, tcfg: TaskConfig, seed: int, device: torch.device | None = None) -> Path:
    # the numerics fingerprint's key (harness/numerics.py): a cache computed by another torch is never read; a warm
    # start computed on another device than the CPU names it (the CPU's key is unchanged: its files stay valid)
    fields = {"model": asdict(mcfg), "task": asdict(tcfg), "seed": seed, "numerics": LOCAL_NUMERICS,
              "fingerprint": numerics.fingerprint()["key"]}
    if device is not None and device.type != "cpu":
        fields["device"] = device_name(device)
    key = json.dumps(fields, sort_keys=True)
    return cache_dir() / f"{mcfg.name}-{tcfg.name}-s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.pt"


def device_name(device: torch.device) -> str:
    """``cuda:<GPU name>`` (the kernels a warm start ran on), or the device type."""
    return f"cuda:{torch.cuda.get_device_name(device)}" if device.type == "cuda" else device.type


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
    cached = _cached_state(path, mcfg)
    if cached is None:
        return None
    policy = Policy(mcfg)  # no random initial weights: the cache's replace them all (checked in _cached_state)
    policy.load_state_dict(cached[0])
    return policy, cached[1]


def _cached_state(path: Path, mcfg: ModelConfig) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The cached (state dict, record), checked against the model's layout, or None with a warning naming ``path``."""
    try:
        blob = torchfile.load(path)  # tensors and plain values: a crafted file is refused, not run
        record = blob.get("record") if isinstance(blob, dict) else None
        if not isinstance(record, dict) or not {"steps", "reward"} <= record.keys() or "state" not in blob:
            raise ValueError("not a warm-start cache: no state and record {steps, reward}")
        state = blob["state"]
        with torch.device("meta"):  # the layout only: no memory, no draws
            want = {n: p.shape for n, p in Policy(mcfg).state_dict().items()}
        got = {n: getattr(v, "shape", None) for n, v in state.items()} if isinstance(state, dict) else {}
        if got != want:
            raise ValueError("its weights are not this model's layout")
    except Exception as exc:  # noqa: BLE001 - truncated, crafted, another layout: made again
        _warn(f"warm-start cache {path} cannot be read ({torchfile.cause(exc)}): warming up again, then replacing it")
        return None
    return state, record


def warm_start_pack(mcfg: ModelConfig, tcfg: TaskConfig, seeds: list[int], device: torch.device | None = None,
                    use_cache: bool = True, progress: bool = True) -> tuple[PolicyPack, list[dict]]:
    """The warm-started policies of ``seeds`` as one pack on ``device`` (default the CPU), and each seed's record:
    cached seeds read, the others warmed up together (module docstring)."""
    numerics.check()
    device = torch.device("cpu") if device is None else device
    states: dict[int, dict[str, torch.Tensor]] = {}
    records: dict[int, dict] = {}
    for s in dict.fromkeys(seeds):
        path = cache_path(mcfg, tcfg, s, device)
        cached = _cached_state(path, mcfg) if use_cache and path.exists() else None
        if cached is not None:
            states[s], records[s] = cached
    missing = [s for s in dict.fromkeys(seeds) if s not in states]
    if missing:
        if Task(tcfg).multi_turn:
            for s in missing:
                policy, records[s] = warm_start(mcfg, tcfg, s, use_cache, progress)
                states[s] = policy.state_dict()
        else:
            for s, (state, record) in zip(missing, _warm_up_together(mcfg, tcfg, missing, device, progress)):
                states[s], records[s] = state, record
                if use_cache:
                    _to_cache(cache_path(mcfg, tcfg, s, device), state, record)
    with device:
        pack = PolicyPack(mcfg, len(seeds))
    with torch.no_grad():
        for name in pack.names:
            pack.weights()[name].copy_(torch.stack([states[s][name] for s in seeds]))
    return pack, [records[s] for s in seeds]


@torch.no_grad()
def _sampled_rewards(pack: PolicyPack, task: Task, gens: list[torch.Generator], n: int = 128) -> list[float]:
    """``sampled_reward`` of each seed of the pack (single-turn tasks), each seed drawing from its own generator."""
    drawn = [task.sample(n, g) for g in gens]
    device = pack.weights()["embed"].device
    tokens = torch.stack([p for p, _ in drawn]).to(device)  # [S, n, P]
    for _ in range(task.answer_len):
        probs = torch.softmax(train_engine.forward(pack, tokens).logits[:, :, -1], -1).cpu()
        picked = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(gens)])
        tokens = torch.cat([tokens, picked.to(device)], -1)
    tokens = tokens.cpu()
    return [task.reward(tokens[i, :, task.prompt_len:], a)[0].mean().item() for i, (_, a) in enumerate(drawn)]


@torch.enable_grad()
def _warm_up_together(mcfg: ModelConfig, tcfg: TaskConfig, seeds: list[int], device: torch.device,
                      progress: bool) -> list[tuple[dict[str, torch.Tensor], dict]]:
    """``warm_start``'s loop for several seeds at once (a single-turn task): the (state, record) of each."""
    ws, task = tcfg.warmstart, Task(tcfg)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)  # noqa: E731
    say(f"warm start of {mcfg.name} on {tcfg.name} (seeds {_span(seeds)}, not cached yet: {len(seeds)} together on "
        f"{device.type}): supervised steps until the sampled reward reaches {ws.target_reward} (at most {ws.max_steps})")
    t0 = time.monotonic()
    pack = PolicyPack.of([build_policy(mcfg, s) for s in seeds]).to(device)  # each seed's own initial draws
    gens = [torch.Generator().manual_seed(s * 7919 + 17) for s in seeds]
    live = list(range(len(seeds)))  # the pack's seeds (indices into ``seeds``) still warming up
    names = pack.names
    moments = {n: (torch.zeros_like(w), torch.zeros_like(w)) for n, w in pack.weights().items()}
    count = {n: torch.tensor(0.0) for n in names}  # AdamW's step count (as torch.optim.AdamW keeps it)
    out: dict[int, tuple[dict[str, torch.Tensor], dict]] = {}
    reward, step = _sampled_rewards(pack, task, gens), 0

    def leave(keep: list[int]) -> None:  # seeds not in ``keep`` (pack positions) are done: record, then drop them
        nonlocal pack, gens, live, moments, reward
        for j, i in enumerate(live):
            if j not in keep:
                out[i] = ({n: pack.weights()[n][j].detach().clone().cpu() for n in names},
                          {"steps": step, "reward": reward[j]})
        if len(keep) == len(live):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=device)
        with device:
            sub = PolicyPack(mcfg, len(keep))
        with torch.no_grad():
            for n in names:
                sub.weights()[n].copy_(pack.weights()[n].index_select(0, idx))
        pack, gens, live = sub, [gens[j] for j in keep], [live[j] for j in keep]
        moments = {n: (m.index_select(0, idx), v.index_select(0, idx)) for n, (m, v) in moments.items()}
        reward = [reward[j] for j in keep]

    leave([j for j in range(len(live)) if reward[j] < ws.target_reward] if step < ws.max_steps else [])
    while live:
        for _ in range(ws.eval_every):
            drawn = [task.sample(ws.batch_size, g) for g in gens]
            pairs = [task.teacher(p, a) for p, a in drawn]  # (response, targets) per seed
            tokens = torch.stack([torch.cat([p, r], 1) for (p, _), (r, _) in zip(drawn, pairs)]).to(device)
            targets = torch.stack([t for _, t in pairs]).to(device)
            logits = train_engine.forward(pack, tokens).logits[:, :, task.prompt_len - 1:-1]
            loss = sum(F.cross_entropy(logits[j].reshape(-1, logits.shape[-1]), targets[j].reshape(-1))
                       for j in range(len(live)))
            weights = pack.weights()
            for w in weights.values():
                w.grad = None
            loss.backward()
            have = [n for n in names if weights[n].grad is not None]
            with torch.no_grad():  # AdamW's step on the stacked weights: torch.optim.AdamW's ops per element
                adam_step([weights[n] for n in have], [weights[n].grad for n in have],
                          [moments[n][0] for n in have], [moments[n][1] for n in have], [],
                          [count[n] for n in have], foreach=None, decoupled_weight_decay=True, amsgrad=False,
                          beta1=0.9, beta2=0.999, lr=ws.lr, weight_decay=0.0, eps=1e-8, maximize=False)
            step += 1
        reward = _sampled_rewards(pack, task, gens)
        leave([j for j in range(len(live)) if reward[j] < ws.target_reward] if step < ws.max_steps else [])
    say(f"warm start done: {len(seeds)} seeds, {time.monotonic() - t0:.0f} s")
    return [out[i] for i in range(len(seeds))]


def _span(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds)) if len(seeds) <= 4 else f"{seeds[0]}, ..., {seeds[-1]}"


def _to_cache(path: Path, policy: "Policy | dict[str, torch.Tensor]", record: dict) -> None:
    """Cache the warm start (atomically: concurrent runs may warm-start the same model); a failed write is a
    warning naming the path, and the run goes on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = policy if isinstance(policy, dict) else policy.state_dict()
        torchfile.save({"state": state, "record": record}, path)
    except torchfile.WriteFailed as exc:
        _warn(f"warm start not cached ({exc}); the next run of this model, task and seed warms up again")
    except OSError as exc:
        _warn(f"warm start not cached (cannot create {path.parent}: {torchfile.cause(exc)}); the next run of this "
              f"model, task and seed warms up again")


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)
