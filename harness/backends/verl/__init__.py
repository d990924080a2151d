"""The verl backend: the same estimators in verl (+ vLLM rollout) on GPU clusters."""
