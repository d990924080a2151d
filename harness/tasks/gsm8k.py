"""``gsm8k``: grade-school math word problems (verl backend only), scored by verl's rule reward.

The rows come from a copy of GSM8K the user provides (runs never download): a ``.jsonl`` or ``.parquet`` file
per split with the release's ``question`` and ``answer`` columns (the reference is the number after ``####``
in ``answer``, commas removed). ``data_source = "openai/gsm8k"`` makes verl score them with its own GSM8K rule
(exact final answer after ``####``), so this task supports ``task.reward=exact`` only.
"""
from __future__ import annotations

from pathlib import Path

from harness.tasks import register
from harness.tasks.base import MARKER, TaskSpec

SOURCE = "openai/gsm8k"
PROMPT = f"{{question}} Let's think step by step and output the final answer after \"{MARKER}\"."


def read(path: Path, split: str) -> list[dict]:
    """verl rows of one split from ``path`` (.jsonl or .parquet with columns question, answer)."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".jsonl":
        df = pd.read_json(path, lines=True)
    elif path.suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        raise ValueError(f"{path}: a GSM8K split is a .jsonl or .parquet file")
    missing = {"question", "answer"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: GSM8K columns {sorted(missing)} missing (has {', '.join(map(str, df.columns))})")
    return [{"data_source": SOURCE, "prompt": [{"role": "user", "content": PROMPT.format(question=q)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": a.split(MARKER)[-1].strip().replace(",", "")},
             "extra_info": {"split": split, "index": idx}}
            for idx, (q, a) in enumerate(zip(df["question"], df["answer"]))]


SPEC = register(TaskSpec(
    name="gsm8k", backends=("verl",), summary="GSM8K math word problems (a file you provide)", rewards=("exact",),
    read=read, data_source=SOURCE, ability="math"))
