"""The inference engine's parts, one concept a module; ``harness.backends.local.inference_engine.InferenceEngine``
assembles them (the class users construct):

- ``kernels``: the dtypes, ``rounder`` and ``_Call`` (independent calls batched along a leading axis: each call's
  split-K factor, selected per row, and its keyed random draws, ``harness.backends.local.philox``);
- ``kv_cache``: ``KVCache``, the preallocated KV cache;
- ``forward``: the forward pass (RMSNorm, RoPE, attention, the MoE layer and its grouped expert GEMMs);
- ``noise``: the explicit perturbations (router and logit noise, fresh or frozen; the biased down-weighting);
- ``sampling``: ``sampler_logp`` (temperature, top-k, top-p), one sampled token, the reported log-prob mode;
- ``rollout``: ``Rollout``, what a generation returns;
- ``decoding``: ``generate``, KV-cached single-turn decoding;
- ``multi_turn``: ``generate_turns`` and ``prefill``, the multi-turn rollout of a tool task;
- ``scoring``: ``score`` and ``score_once``, n independent scorings in one batched prefill.
"""
