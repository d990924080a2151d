"""Prepare the parquet files a verl run reads (run once, on the cluster's shared filesystem).

    python -m harness.backends.verl.data sort     [--length 5] [--root data/verl]  # generated here
    python -m harness.backends.verl.data addition [--length 3]
    python -m harness.backends.verl.data gsm8k                                      # downloads openai/gsm8k

Rows follow verl's RLHFDataset layout (as verl's examples/data_preprocess/gsm8k.py writes them):
``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` {style, ground_truth},
``extra_info``. ``sort``/``addition`` are the local backend's tasks as text (the same digits, the
same answer order) scored by ``reward.py``; GSM8K is scored by verl's built-in rule
(``data_source = "openai/gsm8k"``). Runs never download data: a missing file stops ``train`` in
its preflight with this command in the message.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from harness.config import ROOT

INSTRUCTION = 'Think briefly, then output the final answer after "####".'
GSM8K_SOURCE = "openai/gsm8k"


def sort_text(digits: list[int]) -> tuple[str, str]:
    """(prompt, reference) of the local ``sort`` task's example ``digits``."""
    q = (f"Sort these {len(digits)} digits in ascending order: {' '.join(map(str, digits))}. "
         f"Write the sorted digits separated by spaces. {INSTRUCTION}")
    return q, " ".join(map(str, sorted(digits)))


def addition_text(a: list[int], b: list[int]) -> tuple[str, str]:
    """(prompt, reference) of the local ``addition`` task's example a + b (digits, most significant first)."""
    length = len(a)
    total = int("".join(map(str, a))) + int("".join(map(str, b)))
    answer = [(total // 10**i) % 10 for i in range(length + 1)]  # least significant first, as the local task
    q = (f"Add {''.join(map(str, a))} and {''.join(map(str, b))}. Write the {length + 1} digits of the sum from the "
         f"least significant to the most significant (pad with a leading zero), separated by spaces. {INSTRUCTION}")
    return q, " ".join(map(str, answer))


def sort_example(rng: random.Random, length: int) -> tuple[str, str]:
    return sort_text([rng.randrange(10) for _ in range(length)])


def addition_example(rng: random.Random, length: int) -> tuple[str, str]:
    return addition_text([rng.randrange(10) for _ in range(length)], [rng.randrange(10) for _ in range(length)])


def generated_rows(task: str, length: int, n: int, seed: int, split: str) -> list[dict]:
    make = {"sort": sort_example, "addition": addition_example}[task]
    rng = random.Random(f"{task}-{length}-{seed}-{split}")
    rows = []
    for idx in range(n):
        q, ans = make(rng, length)
        rows.append({"data_source": f"harness/{task}", "prompt": [{"role": "user", "content": q}],
                     "ability": "arithmetic", "reward_model": {"style": "rule", "ground_truth": ans},
                     "extra_info": {"split": split, "index": idx, "length": length}})
    return rows


def gsm8k_rows(split: str) -> list[dict]:
    import datasets  # only on the machine that prepares the data

    ds = datasets.load_dataset(GSM8K_SOURCE, "main")[split]
    rows = []
    for idx, ex in enumerate(ds):
        answer = ex["answer"].split("####")[-1].strip().replace(",", "")
        rows.append({"data_source": GSM8K_SOURCE,
                     "prompt": [{"role": "user", "content": f"{ex['question']} Let's think step by step and output "
                                                            'the final answer after "####".'}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
                     "extra_info": {"split": split, "index": idx}})
    return rows


def write(rows: list[dict], path: Path) -> Path:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def prepare(task: str, root: str | Path = "data/verl", length: int = 5, n_train: int = 20000, n_test: int = 500,
            seed: int = 0) -> Path:
    """Write <root>/<task dir>/{train,test}.parquet (the folder translate.data_dir expects)."""
    root = Path(root)
    root = root if root.is_absolute() else ROOT / root
    if task == "gsm8k":
        out = root / "gsm8k"
        write(gsm8k_rows("train"), out / "train.parquet")
        write(gsm8k_rows("test"), out / "test.parquet")
        return out
    out = root / f"{task}_L{length}"
    write(generated_rows(task, length, n_train, seed, "train"), out / "train.parquet")
    write(generated_rows(task, length, n_test, seed, "test"), out / "test.parquet")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.backends.verl.data", description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=("sort", "addition", "gsm8k"))
    ap.add_argument("--root", default="data/verl", help="folder of the datasets (= verl.data.root)")
    ap.add_argument("--length", type=int, default=None, help="digits per number (= task.length; sort 5, addition 3)")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    length = a.length if a.length is not None else (5 if a.task == "sort" else 3)
    print(prepare(a.task, a.root, length, a.n_train, a.n_test, a.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
