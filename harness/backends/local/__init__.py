"""The local backend: a small Qwen3-MoE-style policy trained with GRPO/PPO in plain PyTorch."""
