"""Prepare the parquet files a verl run reads (run once, on the cluster's shared filesystem).

    python -m harness.backends.verl.data sort     [--length 5] [--root data/verl]  # generated here
    python -m harness.backends.verl.data addition [--length 3]
    python -m harness.backends.verl.data gsm8k --train train.jsonl --test test.jsonl  # your copy of GSM8K

Rows follow verl's RLHFDataset layout (as verl's examples/data_preprocess/gsm8k.py writes them):
``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model`` {style, ground_truth},
``extra_info``. What a task writes is declared in its module (``harness/tasks/<name>.py``): generated
tasks draw ``n`` examples from ``random.Random("<task>-<length>-<seed>-<split>")``, the others read the
files the user names. Nothing here or in a run downloads data: a missing file stops ``train`` in its
preflight with :func:`command` in the message.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from harness import tasks
from harness.uri import home


def generated_rows(task: str, length: int, n: int, seed: int, split: str) -> list[dict]:
    spec = tasks.get(task)
    rng = random.Random(f"{task}-{length}-{seed}-{split}")
    rows = []
    for idx in range(n):
        q, ans = spec.example(rng, length)
        rows.append({"data_source": spec.source, "prompt": [{"role": "user", "content": q}],
                     "ability": spec.ability, "reward_model": {"style": "rule", "ground_truth": ans},
                     "extra_info": {"split": split, "index": idx, "length": length}})
    return rows


def write(rows: list[dict], path: Path) -> Path:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def prepare(task: str, root: str | Path = "data/verl", length: int = 5, n_train: int = 20000, n_test: int = 500,
            seed: int = 0, files: dict[str, str | Path] | None = None) -> Path:
    """Write <root>/<task dir>/{train,test}.parquet (the folder translate.data_dir expects); ``files``
    {split: path} are the user's files of a task that is not generated."""
    spec = tasks.get(task)
    root = Path(root)
    out = (root if root.is_absolute() else home() / root) / spec.data_dir(length)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = generated_rows(task, length, n, seed, split) if spec.generated else spec.read(Path(files[split]), split)
        write(rows, out / f"{split}.parquet")
    return out


def command(task: str, length: int, root: str | Path) -> str:
    """The command that prepares a task's data (quoted in the preflight's message)."""
    spec = tasks.get(task)
    how = f"--length {length}" if spec.generated else "--train <train.jsonl> --test <test.jsonl>"
    return f"python -m harness.backends.verl.data {task} {how} --root {root}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.backends.verl.data", description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=tasks.names("verl"),
                    help="; ".join(f"{n}: {tasks.get(n).summary}" for n in tasks.names("verl")))
    ap.add_argument("--root", default="data/verl", help="folder of the datasets (= verl.data.root)")
    ap.add_argument("--length", type=int, default=None, help="digits per number (= task.length; default: the task's)")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", help="your file of the train split (tasks that are not generated: gsm8k)")
    ap.add_argument("--test", help="your file of the test split (tasks that are not generated: gsm8k)")
    a = ap.parse_args(argv)
    spec = tasks.get(a.task)
    if not spec.generated:
        for split in ("train", "test"):
            path = getattr(a, split)
            if path is None or not Path(path).is_file():
                ap.error(f"--{split}: task {a.task} reads the {split} split from a file you provide "
                         f"({'missing' if path is None else f'{path} does not exist'}); runs never download data")
    length = a.length if a.length is not None else spec.default_length
    print(prepare(a.task, a.root, length, a.n_train, a.n_test, a.seed, files={"train": a.train, "test": a.test}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
