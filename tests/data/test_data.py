"""Tokenizers, data sources, packed LM datasets, the step schedule and prompt/target datasets (all offline)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tapecli.data.pairs import build_pair_datasets, encode_pair
from tapecli.data.sources import is_pretokenized, iter_documents, open_token_memmap
from tapecli.data.text import IGNORE_INDEX, StreamPackedDataset, build_text_datasets, global_indices
from tapecli.data.tokenizer import (
    CHAR_TOKENIZERS,
    load_tokenizer,
    load_tokenizer_dir,
    train_tokenizer,
)
from tapecli.errors import TapeError

TRICKY = "Ünïcödé — 東京 emoji 🙂 tabs\tand  double  spaces\nnewline\n\n  leading spaces, digits 12345."


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def docs_fixture(n: int = 12) -> list[str]:
    """Documents of different lengths, each starting with its number so they are easy to tell apart."""
    return [f"doc {i}: " + "abc " * (3 + 2 * i) for i in range(n)]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece model trained once for the module (training takes ~0.1 s, but it is used often)."""
    import random

    rng = random.Random(0)
    words = "alpha beta gamma delta position encoding rotary attention token model layer train value".split()
    root = tmp_path_factory.mktemp("sp_corpus")
    for d in range(6):
        lines = [" ".join(rng.choices(words, k=10)) + f" {rng.randint(0, 999)}." for _ in range(60)]
        (root / f"{d}.txt").write_text("\n".join(lines) + "\n" + TRICKY, encoding="utf-8")
    return train_tokenizer(str(root), vocab_size=400, out=str(tmp_path_factory.mktemp("sp") / "tok.model"))


# --- tokenizers ---------------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip() -> None:
    tok = load_tokenizer("byte")
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (259, 256, 257, 258)
    ids = tok.encode(TRICKY)
    assert max(ids) < 256 and tok.decode(ids) == TRICKY
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == TRICKY


def test_sentencepiece_training_is_lossless(sp_model: Path, tiny_corpus: Path) -> None:
    tok = load_tokenizer(str(sp_model))
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (400, 0, 2, 3)
    corpus_text = (tiny_corpus / "doc00.txt").read_text(encoding="utf-8")
    for text in (TRICKY, corpus_text, "plain ascii sentence.", "\t\n  \n"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *tok.encode("alpha beta"), tok.eos_id]) == "alpha beta"
    # It learned merges: far fewer tokens than bytes on in-domain text.
    assert len(tok.encode("alpha beta gamma delta")) < len("alpha beta gamma delta") / 2


def test_train_tokenizer_from_jsonl_and_too_small_vocab(tiny_corpus: Path, tmp_path: Path) -> None:
    rows = [{"text": p.read_text(encoding="utf-8")} for p in sorted(tiny_corpus.glob("*.txt"))]
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    out = train_tokenizer(str(data), vocab_size=360, out=str(tmp_path / "small.model"))
    assert load_tokenizer(str(out)).decode(load_tokenizer(str(out)).encode(rows[0]["text"])) == rows[0]["text"]
    with pytest.raises(TapeError, match="cannot train a 40-piece tokenizer .*: Vocabulary size is smaller"):
        train_tokenizer(str(tiny_corpus), vocab_size=40, out=str(tmp_path / "tiny.model"))
    with pytest.raises(TapeError, match=r"must end with \.model"):
        train_tokenizer(str(tiny_corpus), vocab_size=360, out=str(tmp_path / "tok.bin"))


def make_hf_tokenizer(path: Path, specials: list[str]) -> Path:
    from tokenizers import Tokenizer as HFBackend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = HFBackend(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(docs_fixture() + [TRICKY], trainer=trainer)
    tk.save(str(path))
    return path


def test_hf_tokenizer_json(tmp_path: Path) -> None:
    path = make_hf_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>", "<pad>"])
    tok = load_tokenizer(str(path))
    assert tok.bos_id == tok.eos_id == 0 and tok.pad_id == 1
    ids = tok.encode(TRICKY)
    assert tok.bos_id not in ids and tok.decode([tok.bos_id, *ids, tok.eos_id]) == TRICKY

    llama_like = load_tokenizer(str(make_hf_tokenizer(tmp_path / "ll.json", ["<s>", "</s>"])))
    assert (llama_like.bos_id, llama_like.eos_id, llama_like.pad_id) == (0, 1, 1)  # pad falls back to EOS

    no_specials = make_hf_tokenizer(tmp_path / "plain.json", [])
    with pytest.raises(TapeError, match="no recognisable BOS/EOS"):
        load_tokenizer(str(no_specials))


def test_save_and_load_dir_round_trip(sp_model: Path, tmp_path: Path) -> None:
    hf = make_hf_tokenizer(tmp_path / "tokenizer.json", ["<s>", "</s>"])
    for spec in ("byte", str(sp_model), str(hf)):
        tok = load_tokenizer(spec)
        directory = tmp_path / f"saved-{tok.kind}"
        tok.save(directory)
        assert (directory / "tokenizer_meta.json").is_file()
        again = load_tokenizer_dir(directory)
        assert type(again) is type(tok)
        assert (again.vocab_size, again.bos_id, again.eos_id, again.pad_id) == (
            tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id)
        assert again.encode(TRICKY) == tok.encode(TRICKY)
        assert load_tokenizer(str(directory)).encode("abc") == tok.encode("abc")  # a saved dir is a valid spec too


def test_character_tokenizers_round_trip_and_load_from_old_checkpoints(tmp_path: Path) -> None:
    for name, symbols in CHAR_TOKENIZERS.items():
        tok = load_tokenizer(name)
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 3 + len(symbols))
        assert tok.decode(tok.encode(symbols) + [tok.eos_id]) == symbols
        # what every earlier version wrote into a checkpoint's tokenizer/ folder: only the kind
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer_meta.json").write_text(f'{{"kind": "{name}"}}\n')
        assert load_tokenizer_dir(tmp_path / name).encode(symbols) == tok.encode(symbols)
    assert load_tokenizer("addition").digit_ids == list(range(3, 13)) and load_tokenizer("synthetic").digit_ids is None


def test_tokenizer_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(TapeError, match="missing.model does not exist"):
        load_tokenizer(str(tmp_path / "missing.model"))
    with pytest.raises(TapeError, match="unknown tokenizer 'gpt5'.*byte.*SentencePiece .model.*tokenizer.json"):
        load_tokenizer("gpt5")
    with pytest.raises(TapeError, match="tokenizer_meta.json does not exist"):
        load_tokenizer_dir(tmp_path)


# --- sources ------------------------------------------------------------------------------------------------


def test_local_sources(tmp_path: Path) -> None:
    docs = docs_fixture(4)
    (tmp_path / "one.txt").write_text(TRICKY, encoding="utf-8")
    assert list(iter_documents(str(tmp_path / "one.txt"))) == [TRICKY]

    jsonl = write_jsonl(tmp_path / "d.jsonl", [{"body": d, "id": i} for i, d in enumerate(docs)])
    assert list(iter_documents(str(jsonl), text_field="body")) == docs

    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": docs, "n": list(range(4))}), parquet)
    assert list(iter_documents(str(parquet))) == docs

    # Directories are read recursively in sorted path order, skipping unsupported files and .bin sidecars.
    root = tmp_path / "tree"
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_text("first", encoding="utf-8")
    write_jsonl(root / "b" / "c.jsonl", [{"text": "second"}, {"text": "third"}])
    (root / "b" / "notes.md").write_text("ignored")
    (root / "b" / "tok.bin.json").write_text('{"dtype": "uint32"}')
    assert list(iter_documents(str(root))) == ["first", "second", "third"]
    assert list(iter_documents(str(root / "**" / "*.jsonl"))) == ["second", "third"]
    assert list(iter_documents(str(tmp_path / "*.txt"))) == [TRICKY]


def test_token_memmaps(tmp_path: Path) -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    tokens.tofile(tmp_path / "a.bin")
    assert is_pretokenized(str(tmp_path / "a.bin")) and not is_pretokenized(str(tmp_path / "a.jsonl"))
    mm = open_token_memmap(str(tmp_path / "a.bin"))
    assert mm.dtype == np.uint16 and np.array_equal(mm, tokens)

    big = np.array([70_000, 1, 2**32 - 1], dtype=np.uint32)
    big.tofile(tmp_path / "b.u32.bin")
    assert open_token_memmap(str(tmp_path / "b.u32.bin")).tolist() == big.tolist()
    big.tofile(tmp_path / "c.bin")
    (tmp_path / "c.bin.json").write_text(json.dumps({"dtype": "uint32"}))
    assert open_token_memmap(str(tmp_path / "c.bin")).tolist() == big.tolist()

    with pytest.raises(TapeError, match="holds token ids, not text"):
        next(iter_documents(str(tmp_path / "a.bin")))
    with pytest.raises(TapeError, match="nope.bin does not exist"):
        open_token_memmap(str(tmp_path / "nope.bin"))


def test_source_errors_name_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(TapeError, match="missing.jsonl does not exist"):
        list(iter_documents(str(tmp_path / "missing.jsonl")))
    jsonl = write_jsonl(tmp_path / "d.jsonl", [{"content": "x"}])
    with pytest.raises(TapeError, match=r"d\.jsonl row 0 has no field 'text' \(fields: content\)"):
        list(iter_documents(str(jsonl)))
    with pytest.raises(TapeError, match="no .* files match"):
        list(iter_documents(str(tmp_path / "*.parquet")))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(TapeError, match=r"^data.source: .*x\.csv is not a \.txt, \.jsonl, \.json, \.parquet or \.bin "
                                         "file; pass data.source=PATH"):
        list(iter_documents(str(tmp_path / "x.csv")))
    with pytest.raises(TapeError, match="^--data: .*missing.jsonl does not exist; pass --data PATH"):
        list(iter_documents(str(tmp_path / "missing.jsonl"), what="--data"))


def test_offline_hub_dataset_is_one_clear_sentence() -> None:
    start = time.monotonic()
    with pytest.raises(TapeError) as err:
        next(iter_documents("allenai/c4:en"))
    assert time.monotonic() - start < 10
    assert str(err.value) == (
        "data.source: dataset 'allenai/c4' could not be loaded (the Hugging Face hub is unreachable or offline); "
        "pass data.source=PATH (a text file, a folder of .txt/.jsonl/.json/.parquet files, a glob)"
    )


# --- packed datasets ----------------------------------------------------------------------------------------


def packed_stream(ds) -> list[int]:
    """All tokens of a finite packed dataset, reassembled from its blocks."""
    out: list[int] = []
    for i in range(len(ds)):
        x, y = ds[i]
        out += [*x.tolist(), y[-1].item()]
    return out


def test_packing_boundaries_shift_and_split(tmp_path: Path) -> None:
    tok = load_tokenizer("byte")
    docs = docs_fixture(12)
    source = str(write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in docs]))
    train, val = build_text_datasets(source, tok, seq_len=16, val_fraction=0.25, seed=0)

    for ds in (train, val):
        x, y = ds[0]
        assert x.shape == y.shape == (16,) and x.dtype == y.dtype == torch.long
        assert torch.equal(x[1:], y[:-1])  # labels are the inputs shifted by one
        assert x[0].item() == tok.bos_id  # every split starts at a document boundary

    def documents_in(ds) -> list[str]:
        """Split the reassembled stream at BOS/EOS; the last document may be cut by the dropped tail."""
        text = bytes(t if t < 256 else 0 for t in packed_stream(ds)).decode()
        return [d for d in text.split("\0") if d]

    train_docs, val_docs = documents_in(train), documents_in(val)
    assert len(val_docs) == 3  # round(12 * 0.25) whole documents
    assert set(train_docs[:-1]) <= set(docs) and set(val_docs[:-1]) <= set(docs)
    val_ids = {d.split(":")[0] for d in val_docs}
    assert not val_ids & {d.split(":")[0] for d in train_docs}  # disjoint by document
    assert len(train) == (sum(len(d) + 2 for d in docs if d.split(":")[0] not in val_ids)) // 17

    again_train, again_val = build_text_datasets(source, tok, seq_len=16, val_fraction=0.25, seed=0)
    assert packed_stream(again_train) == packed_stream(train) and packed_stream(again_val) == packed_stream(val)
    _, other_val = build_text_datasets(source, tok, seq_len=16, val_fraction=0.25, seed=1)
    assert {d.split(":")[0] for d in documents_in(other_val)} != val_ids

    no_val_train, no_val = build_text_datasets(source, tok, seq_len=16, val_fraction=0.0, seed=0)
    assert no_val is None and len(no_val_train) == sum(len(d) + 2 for d in docs) // 17


def test_packing_with_sentencepiece_and_cache_dir(sp_model: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(str(sp_model))
    train, val = build_text_datasets(str(tiny_corpus), tok, seq_len=32, val_fraction=0.2, seed=3)
    cache = tmp_path / "cache"
    cached_train, cached_val = build_text_datasets(str(tiny_corpus), tok, seq_len=32, val_fraction=0.2, seed=3,
                                                   cache_dir=cache)
    assert packed_stream(cached_train) == packed_stream(train) and packed_stream(cached_val) == packed_stream(val)
    assert len(list(cache.iterdir())) == 1
    build_text_datasets(str(tiny_corpus), tok, seq_len=64, val_fraction=0.2, seed=3, cache_dir=cache)
    assert len(list(cache.iterdir())) == 1  # seq_len is cut at load time: same cache entry
    build_text_datasets(str(tiny_corpus), tok, seq_len=32, val_fraction=0.2, seed=4, cache_dir=cache)
    assert len(list(cache.iterdir())) == 2


def test_pretokenized_bin_dataset(tmp_path: Path) -> None:
    tok = load_tokenizer("byte")
    np.arange(170, dtype=np.uint16).tofile(tmp_path / "t.bin")  # 10 blocks of 17 tokens
    train, val = build_text_datasets(str(tmp_path / "t.bin"), tok, seq_len=16, val_fraction=0.2, seed=0)
    assert (len(train), len(val)) == (8, 2)
    assert train[0][0].tolist() == list(range(16)) and train[0][1].tolist() == list(range(1, 17))
    assert val[1][1][-1].item() == 169  # validation is the last blocks
    with pytest.raises(IndexError):
        train[8]

    np.full(34, 300, dtype=np.uint16).tofile(tmp_path / "big.bin")
    bad, _ = build_text_datasets(str(tmp_path / "big.bin"), tok, seq_len=16, val_fraction=0.0, seed=0)
    with pytest.raises(TapeError, match="token id 300 .* vocab size 259"):
        bad[0]


def test_stream_dataset_matches_packing_and_resumes(tmp_path: Path) -> None:
    tok = load_tokenizer("byte")
    source = str(write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in docs_fixture(8)]))
    packed, _ = build_text_datasets(source, tok, seq_len=16, val_fraction=0.0, seed=0)
    stream = StreamPackedDataset(lambda: iter_documents(source), tok, seq_len=16, keep=lambda i: True)
    assert stream.num_examples is None
    with pytest.raises(TypeError):
        len(stream)
    for i in (0, 1, 4, 5, len(packed) - 1):  # increasing indices skip ahead
        assert all(torch.equal(a, b) for a, b in zip(stream[i], packed[i], strict=True))
    assert torch.equal(stream[2][0], packed[2][0])  # going back restarts the stream
    with pytest.raises(IndexError):
        stream[len(packed)]


def test_global_indices_epochs_and_resume() -> None:
    n, batch = 10, 4
    schedule = [global_indices(step, batch, n, seed=7) for step in range(10)]  # 40 positions = 4 epochs
    flat = [i for batch_indices in schedule for i in batch_indices]
    epochs = [flat[e * n : (e + 1) * n] for e in range(4)]
    assert all(sorted(epoch) == list(range(n)) for epoch in epochs)
    assert epochs[0] != epochs[1]  # a fresh permutation every epoch
    assert epochs[0] == torch.randperm(n, generator=torch.Generator().manual_seed(7)).tolist()
    assert global_indices(6, batch, n, seed=7) == schedule[6]  # a resumed run asks for step 6 directly
    assert global_indices(0, batch, n, seed=8) != schedule[0]
    assert global_indices(3, batch, None, seed=7) == [12, 13, 14, 15]


# --- prompt/target datasets ---------------------------------------------------------------------------------


def test_pair_dataset_masks_prompt_and_padding(tmp_path: Path) -> None:
    tok = load_tokenizer("byte")
    rows = [{"prompt": f"Q{i}: 2+{i}=", "target": str(2 + i)} for i in range(10)]
    source = str(write_jsonl(tmp_path / "pairs.jsonl", rows))
    train, val = build_pair_datasets(source, tok, seq_len=12, val_fraction=0.2, seed=0)
    assert (len(train), len(val)) == (8, 2)

    x, y = encode_pair(tok, "Q1: 2+1=", "3", seq_len=12)
    seq = [tok.bos_id, *b"Q1: 2+1=", *b"3", tok.eos_id]  # 11 tokens -> 10 input positions + 2 pads
    assert x.tolist() == seq[:-1] + [tok.pad_id] * 2
    assert y.tolist() == [IGNORE_INDEX] * 8 + [ord("3"), tok.eos_id] + [IGNORE_INDEX] * 2
    all_inputs = [ds[i][0].tolist() for ds in (train, val) for i in range(len(ds))]
    assert x.tolist() in all_inputs

    # Too long: prompt tokens are dropped from the left, the target is kept whole.
    x, y = encode_pair(tok, "a long prompt that does not fit", "TARGET", seq_len=12)
    assert x.tolist() == [tok.bos_id, *b"t fit", *b"TARGET"]  # seq_len + 1 = 13 tokens in all, minus the EOS
    assert y.tolist() == [IGNORE_INDEX] * 5 + [*b"TARGET", tok.eos_id]
    with pytest.raises(TapeError, match="target of 11 tokens does not fit seq_len 12"):
        encode_pair(tok, "p", "much longer", seq_len=12)


def test_pair_dataset_missing_field(tmp_path: Path) -> None:
    source = str(write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a", "answer": "b"}]))
    with pytest.raises(TapeError, match=r"pairs\.jsonl row 0 has no field 'target'"):
        build_pair_datasets(source, load_tokenizer("byte"), seq_len=8, val_fraction=0.0, seed=0)
