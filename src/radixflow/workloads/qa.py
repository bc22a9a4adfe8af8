"""The paper's multi-candidate QA workload, synthesised with QuALITY and RACE-M shapes (SPEC §10).

Each question is one logical request with four branches: document + question + one candidate, each
generating one token. Streams are built with cache namespaces: cold (no sharing between questions),
reuse (questions on the same document back to back), mixed (documents interleaved).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

STREAMS = ("cold", "reuse", "mixed")
ORDERS = ("forward", "reverse")


@dataclass(frozen=True)
class Question:
    qid: str
    article: str
    article_len: int
    question_len: int
    candidate_lens: tuple[int, ...]


@dataclass(frozen=True)
class DatasetShape:
    name: str
    questions: int
    articles: int
    article_len: tuple[int, int]  # min, max tokens
    question_len: tuple[int, int]
    candidate_len: tuple[int, int]


QUALITY = DatasetShape("quality", 1034, 62, (2000, 8000), (12, 40), (4, 40))
RACE_M = DatasetShape("race-m", 517, 128, (250, 350), (8, 20), (2, 12))


def synth_questions(shape: DatasetShape, rng: random.Random, n: int | None = None,
                    article_scale: float = 1.0) -> list[Question]:
    """Articles with lengths in the shape's range; questions spread over them (grouped by article)."""
    lo, hi = (max(1, round(x * article_scale)) for x in shape.article_len)
    arts = [(f"{shape.name}:a{i}", rng.randint(lo, hi)) for i in range(shape.articles)]
    counts = [shape.questions // shape.articles] * shape.articles
    for i in range(shape.questions - sum(counts)):
        counts[i] += 1
    out = []
    for (aid, alen), c in zip(arts, counts):
        for j in range(c):
            cands = tuple(rng.randint(*shape.candidate_len) for _ in range(4))
            out.append(Question(f"{aid}:q{j}", aid, alen, rng.randint(*shape.question_len), cands))
    if n is not None:
        out = out[:n]
    return out


def paper_questions(seed: int = 0, questions: int | None = None, article_scale: float = 1.0) -> list[Question]:
    """QuALITY (1,034) + RACE-M (517) questions; `questions` keeps that mix in proportion.

    `article_scale` shrinks article lengths (the real engine on a CPU runs scaled-down documents)."""
    if article_scale <= 0:
        raise ValueError(f"--article-scale must be > 0, got {article_scale}")
    rng = random.Random(seed)
    nq = nr = None
    if questions is not None:
        if questions < 1:
            raise ValueError("--questions must be >= 1")
        nq = round(questions * QUALITY.questions / (QUALITY.questions + RACE_M.questions))
        nr = questions - nq
    return synth_questions(QUALITY, rng, nq, article_scale) + synth_questions(RACE_M, rng, nr, article_scale)


def stream_records(questions: list[Question], stream: str, order: str, rate: float, seed: int,
                   prefix: str = "", branch_gap: float = 0.0) -> list[dict]:
    """Trace records (segments form) for one stream and input order, with Poisson arrivals.

    `branch_gap` > 0 spreads a question's branches: each arrives an exponential gap (this mean, in
    seconds) after the previous one, as when a client sends the candidates as separate requests."""
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}; choose from {', '.join(STREAMS)}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    if rate < 0:
        raise ValueError("--rate must be >= 0 (0 = all arrive at once)")
    qs = list(questions)
    if stream == "mixed":
        random.Random(seed + 17).shuffle(qs)
    if order == "reverse":
        qs.reverse()
    if branch_gap < 0:
        raise ValueError("--branch-gap must be >= 0")
    rng = random.Random(seed + 1)
    gaps = random.Random(seed + 2)
    t = 0.0
    recs = []
    for q in qs:
        if rate > 0:
            t += rng.expovariate(rate)
        ns = f"{prefix}cold:{q.qid}" if stream == "cold" else f"{prefix}{stream}"
        tb = t
        for i, clen in enumerate(q.candidate_lens):
            if i and branch_gap > 0:
                tb += gaps.expovariate(1.0 / branch_gap)
            recs.append({"request_id": f"{prefix}{q.qid}", "branch": i, "arrival": round(tb, 6), "namespace": ns,
                         "max_new_tokens": 1,
                         "segments": [{"id": q.article, "len": q.article_len},
                                      {"id": f"{q.qid}:question", "len": q.question_len},
                                      {"id": f"{q.qid}:cand{i}", "len": clen}]})
    return recs
