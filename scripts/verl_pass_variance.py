"""How much do mean_n's vLLM re-scoring passes differ? (``make verl-pass-variance``; GPU + vLLM, not CI)

Not run on a GPU by the project yet; on CPU it runs end to end with a tiny random model and a fake of vLLM's
AsyncLLM (``tests/backends/verl/test_verl_scripts.py``). It drives vLLM's AsyncLLM through the same
``score_response`` the ``harness_mean_n`` agent loop uses (plugins/mean_n.py), with verl's
``prompt_logprobs`` layout, and compares two ways of issuing the n passes of a response:

* ``concurrent``: all n at once (``asyncio.gather``, the design before issue 14): they land in one
  engine step, where identical rows compute identically;
* ``sequential``: one after the other (the design now), while background sampling requests keep
  the engine busy, so each pass is computed in another batch.

For each mode it prints, over all response tokens: the mean and max over tokens of the pass-to-pass
standard deviation of log p (nats), and the share of tokens whose n passes are bit-identical. If
``sequential`` shows (near) zero spread too, mean_n on verl is mean_1 in effect on this setup.

    python scripts/verl_pass_variance.py --model Qwen/Qwen3-30B-A3B --tp 4 --n 8 --responses 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from uuid import uuid4

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def verl_prompt_logprobs(prompt_ids: list[int], vllm_prompt_logprobs) -> list[list[float]]:
    """vLLM's ``RequestOutput.prompt_logprobs`` (None, then one {token: Logprob} per token) in verl's
    layout (``extract_prompt_logprobs``): row j = log p(token j+1 | tokens 0..j), then a dummy row."""
    rows = [[float(vllm_prompt_logprobs[j + 1][prompt_ids[j + 1]].logprob)] for j in range(len(prompt_ids) - 1)]
    return rows + [[0.0]]


class AsyncLLMScorer:
    """verl's ``LLMServerClient.generate`` signature on top of vLLM's AsyncLLM (what score_response calls)."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from vllm import SamplingParams

        params = SamplingParams(**sampling_params)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": list(prompt_ids)}, params, request_id):
            final = out
        return SimpleNamespace(extra_fields={"prompt_logprobs": verl_prompt_logprobs(prompt_ids, final.prompt_logprobs)})

    async def sample(self, prompt_ids: list[int], max_tokens: int, seed: int) -> list[int]:
        from vllm import SamplingParams

        final = None
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
        async for out in self.engine.generate({"prompt_token_ids": prompt_ids}, params, uuid4().hex):
            final = out
        return list(final.outputs[0].token_ids)


def spread(scores) -> dict:
    """scores: list of [n, R] tensors -> pass-to-pass statistics over all tokens (None where no token)."""
    import torch

    std = torch.cat([s.std(0) for s in scores])
    same = torch.cat([(s == s[0]).all(0) for s in scores]).float()
    if std.numel() == 0:  # every response empty (EOS first): nothing to compare
        return {"tokens": 0, "std_mean": None, "std_max": None, "identical_frac": None}
    return {"tokens": int(std.numel()), "std_mean": float(std.mean()), "std_max": float(std.max()),
            "identical_frac": float(same.mean())}


def chat_prompt_ids(tok, text: str) -> list[int]:
    """The token ids of one user turn + the generation prompt, as verl's dataset builds prompts (Qwen3:
    thinking off, as the presets' ``chat_template_kwargs``). transformers 5's ``apply_chat_template(...,
    tokenize=True)`` returns a BatchEncoding (a mapping), 4's a list: both give a flat list of ints here."""
    out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                  enable_thinking=False)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    if ids and isinstance(ids[0], (list, tuple)):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


def prompt_text(i: int) -> str:
    return f"Sort these digits: {' '.join(str((i * 7 + j) % 10) for j in range(6))}"


async def run(args) -> dict:
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [chat_prompt_ids(tok, prompt_text(i)) for i in range(args.responses)]
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=args.model, tensor_parallel_size=args.tp,
                                                       gpu_memory_utilization=args.gpu_memory_utilization))
    try:
        return await measure(args, AsyncLLMScorer(engine), prompts)
    finally:
        if hasattr(engine, "shutdown"):
            engine.shutdown()


async def measure(args, scorer: AsyncLLMScorer, prompts: list[list[int]]) -> dict:
    import os

    import torch

    from harness.backends.verl.plugins import mean_n

    responses = await asyncio.gather(*(scorer.sample(list(p), args.max_tokens, i) for i, p in enumerate(prompts)))
    out = {"model": args.model, "tp": args.tp, "n": args.n, "vllm_batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0")}

    async def concurrent(p, r):
        passes = await asyncio.gather(*(mean_n.score_response(scorer, p, r, 1) for _ in range(args.n)))
        return torch.cat(passes)

    scores = await asyncio.gather(*(concurrent(list(p), r) for p, r in zip(prompts, responses)))
    out["concurrent"] = spread(scores)

    stop = asyncio.Event()

    async def background(i):  # keep the engine busy with sampling, as verl's rollout does
        while not stop.is_set():
            await scorer.sample(list(prompts[i % len(prompts)]), args.max_tokens, 10_000 + i)

    bg = [asyncio.create_task(background(i)) for i in range(args.background)]
    scores = await asyncio.gather(*(mean_n.score_response(scorer, list(p), r, args.n) for p, r in zip(prompts, responses)))
    stop.set()
    await asyncio.gather(*bg)
    out["sequential"] = spread(scores)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen3-30B-A3B")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--responses", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--background", type=int, default=64, help="sampling requests kept in flight while scoring")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    args = ap.parse_args(argv)
    for key, value, low in (("--n", args.n, 2), ("--tp", args.tp, 1), ("--responses", args.responses, 1),
                            ("--max-tokens", args.max_tokens, 1), ("--background", args.background, 0)):
        if value < low:
            print(f"error: {key}: must be >= {low}, got {value} (--n: a spread needs two passes)", file=sys.stderr)
            return 2
    from harness.backends.verl.runner import offline_model_problem

    problem = offline_model_problem(args.model, "--model")
    if problem:
        print(f"error: --model: {problem}", file=sys.stderr)
        return 2
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"error: vLLM is not importable ({exc}); run this on a GPU node with pip install -e '.[cluster]'",
              file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
