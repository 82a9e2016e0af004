"""The toy task GRPO learns in the tests and the benchmark: answer about the noun asked.

The tiny policies of ``examples/lm/tiny_policy.py`` were pretrained on short sentences
about nouns (cats, trains, soup ...). Asked "Describe the train.", the base model answers
with a sentence about some noun, and only now and then one whose subject is the train
(about a tenth of its samples). The task: an answer whose subject is the noun asked about
("The train ..."), the row's ``answer``. GRPO has what it needs from the start (groups in
which some answers earn 1 and others 0) and must move the policy from about 0.1 to 0.8
and more.

    python examples/grpo_task.py prompts.jsonl      # the dataset: 200 chat prompts

The reward, by import path: ``--reward grpo_task:answers_about_the_noun`` (the examples
folder on the path, as the trainer puts it).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "lm"))
from tiny_policy import all_nouns, question


def answers_about_the_noun(completion: str, row: Mapping[str, Any]) -> float:
    """1.0 when the answer's first two words are "The <answer>" (the row's answer)."""
    words = completion.strip().lower().replace(".", " ").split()
    return float(words[:2] == ["the", str(row["answer"]).lower()])


def prompts(count: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Chat prompts, each asking about a noun, with the noun as its answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        noun = rng.choice(all_nouns())
        rows.append(
            {"messages": [{"role": "user", "content": question(rng, noun)}], "answer": noun}
        )
    return rows


def write(path: Path, count: int = 200, seed: int = 0) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in prompts(count, seed)))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/grpo_task.py OUT.jsonl")
    print(write(Path(sys.argv[1])))
