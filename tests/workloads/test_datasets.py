import json

import pytest

from radixflow.cli import main
from radixflow.workloads.datasets import DatasetError, load_questions


@pytest.fixture
def dataset(tmp_path):
    q = tmp_path / "QuALITY.v1.0.1.htmlstripped.dev"
    art = "word " * 100
    q.write_text(json.dumps({"article_id": "a1", "article": art, "questions": [
        {"question": "Who is it?", "options": ["one", "two words", "three more words", "x"]},
        {"question": "Why?", "options": ["a", "b", "c", "d"]}]}) + "\n")
    (tmp_path / "RACE" / "dev" / "middle").mkdir(parents=True)
    (tmp_path / "RACE" / "dev" / "middle" / "1.txt").write_text(json.dumps({
        "id": "middle1.txt", "article": "short story " * 10, "questions": ["What?"],
        "options": [["yes", "no", "maybe", "never ever"]], "answers": ["A"]}))
    return tmp_path


def test_loads_both_formats_with_the_word_estimate(dataset):
    qs = load_questions(str(dataset))
    assert len(qs) == 3
    quality = [q for q in qs if q.article == "quality:a1"]
    assert len(quality) == 2 and quality[0].article_len == 130  # ceil(1.3 * 100)
    assert quality[0].candidate_lens == (2, 3, 4, 2)
    race = [q for q in qs if q.article.startswith("race:")][0]
    assert race.article_len == 26 and race.question_len == 2


def test_tokenizer_counts_tokens(dataset, tmp_path):
    from radixflow.engine.tokenizer import save_byte_tokenizer

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    save_byte_tokenizer(tok_dir)
    qs = load_questions(str(dataset), str(tok_dir / "tokenizer.json"))
    assert qs[0].question_len == len(b"Who is it?")  # byte-level: one token per byte


def test_errors_name_the_file(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_questions(str(tmp_path / "nope"))
    bad = tmp_path / "quality.jsonl"
    bad.write_text('{"article_id": "x"}\n')
    with pytest.raises(DatasetError, match="quality.jsonl:1"):
        load_questions(str(bad))


def test_simulate_runs_on_a_dataset(dataset, tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--dataset-path", str(dataset), "--stream", "cold", "--order", "forward",
                 "--policy", "radix,radixflow", "--json", str(out)]) == 0
    arms = json.loads(out.read_text())["arms"]
    assert arms[0]["requests"] == 3 and arms[0]["branches"] == 12
