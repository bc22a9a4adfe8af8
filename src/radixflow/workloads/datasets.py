"""Loaders for the real QuALITY and RACE files, when a user has them locally (`--dataset-path`).

Only lengths are taken (the simulator's traces are built from segments whose tokens derive from ids):
the article, the question and each option are counted with an HF `tokenizer.json` when one is given,
else estimated as ceil(1.3 × words) (≈ the tokens per English word of BPE vocabularies).

- QuALITY: JSON-lines files, one article per line: `article_id`, `article`,
  `questions: [{question, options: [4 strings]}]` (the `QuALITY.v1.0.1.htmlstripped.*` files).
- RACE: one JSON object per file (`*.txt` or `*.json`): `id`, `article`, `questions: [str]`,
  `options: [[4 strings]]` (the `RACE/{train,dev,test}/{middle,high}/` layout).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from radixflow.workloads.qa import Question
from radixflow.workloads.trace import read_jsonl

WORDS_TO_TOKENS = 1.3


class DatasetError(ValueError):
    """A dataset file that cannot be read; the message names the file."""


def _counter(tokenizer_json: str | None):
    if tokenizer_json is None:
        return lambda text: max(1, math.ceil(WORDS_TO_TOKENS * len(text.split())))
    from tokenizers import Tokenizer

    path = Path(tokenizer_json)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DatasetError(f"tokenizer file {path} does not exist")
    tok = Tokenizer.from_file(str(path))
    return lambda text: max(1, len(tok.encode(text, add_special_tokens=False).ids))


def _quality(path: Path, count) -> list[Question]:
    out = []
    for n, rec in read_jsonl(path, DatasetError):
        try:
            aid, article, qs = rec["article_id"], rec["article"], rec["questions"]
        except (KeyError, TypeError) as e:
            raise DatasetError(f"{path}:{n}: not a QuALITY record (missing {e})") from None
        alen = count(article)
        for j, q in enumerate(qs):
            opts = q.get("options") or []
            if not opts:
                raise DatasetError(f"{path}:{n}: question {j} has no options")
            out.append(Question(f"quality:{aid}:q{j}", f"quality:{aid}", alen, count(q["question"]),
                                tuple(count(o) for o in opts)))
    return out


def _race(path: Path, count) -> list[Question]:
    try:
        rec = json.loads(path.read_text())
        aid, article, qs, opts = rec.get("id", path.stem), rec["article"], rec["questions"], rec["options"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DatasetError(f"{path}: not a RACE record ({e})") from None
    if len(qs) != len(opts):
        raise DatasetError(f"{path}: {len(qs)} questions but {len(opts)} option lists")
    alen = count(article)
    return [Question(f"race:{aid}:q{j}", f"race:{aid}", alen, count(q), tuple(count(o) for o in o4))
            for j, (q, o4) in enumerate(zip(qs, opts))]


def load_questions(dataset_path: str, tokenizer_json: str | None = None) -> list[Question]:
    """Every QuALITY and RACE question under `dataset_path` (a file or a directory), articles grouped."""
    root = Path(dataset_path)
    if not root.exists():
        raise DatasetError(f"--dataset-path {root} does not exist")
    count = _counter(tokenizer_json)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    out: list[Question] = []
    for f in files:
        head = f.read_text(errors="replace")[:2000].lstrip()
        if not head.startswith("{"):
            continue
        first = head.split("\n", 1)[0]
        if '"article_id"' in first or "quality" in f.name.lower():
            out += _quality(f, count)
        elif '"article"' in head and '"options"' in head:
            out += _race(f, count)
    if not out:
        raise DatasetError(f"no QuALITY or RACE questions found under {root}")
    return out
