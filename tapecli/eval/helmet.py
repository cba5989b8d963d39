"""HELMET (princeton-nlp/HELMET: data.py, model_utils.py, utils.py, configs/recall*.yaml, scripts/collect_results.py):
its synthetic recall category (JSON KV, RULER MK needle, MK UUID, multi-value), its RAG category (NQ, TriviaQA,
HotpotQA, PopQA among retrieved passages) and its re-ranking category (MS MARCO passages, NDCG@10) at HELMET's input
lengths; its many-shot ICL and long-document QA categories (`tapecli.eval.helmet_prepared`: rows made from the
Hugging Face datasets HELMET reads, scored by `tapecli.eval.helmet_answer`); its summarisation and citation
categories through the hooks of `tapecli.eval.helmet_summ_cite` (their files, cuts, draws and metrics).

Data: HELMET's released jsonl files (`tapecli.data.helmet`): `--data` the extracted data/ folder, or the hub's
data.tar.gz for users with a network. Per task and length (`--tasks`, `--lengths`: HELMET's input_max_length, 4K to
128K), the file's rows are drawn as HELMET draws `max_test_samples`, 100 as in its configs (`--samples`): recall,
`datasets.Dataset.shuffle(seed=42)` and the first N; RAG and re-ranking, load_qa's (load_msmarco_rerank's)
`random.sample(sorted(keys), N)` after `random.seed(42)`, every row of a drawn key kept (PopQA first keeps log10(s_pop)
< 3). Each row is filled into the task's prompt (data.py's template, json_kv with the row's first `--shots` demos, RAG
and re-ranking with `--shots` demonstrations drawn per question by the loaders' sha256-seeded shuffle of the
demonstration file, 2 as in the configs; `use_chat_template: false`) and encoded with the tokenizer's default special
tokens; when longer than the length less the tokens to generate, the context alone is cut at its end by as many tokens
as the prompt is over (model_utils.py's `tokenize`: the context's tokens, the last ones dropped, decoded) and the
prompt filled again. The model decodes greedily up to the task's generation_max_length (json_kv and MK UUID 100, MK
needle and multi-value 50, RAG 20, re-ranking 200), stopping at EOS (RAG and re-ranking also at a token that is a new
line: `stop_new_line: true`), and the output is scored by HELMET's metric (`tapecli.eval.helmet_metric`,
`helmet_rerank`): SubEM (the raw or the parsed output, the larger) for json_kv and RAG, RULER recall for the RULER
tasks, NDCG@10 of the parsed ranking for re-ranking.

results.json, per model: `scores[task][length]` (the mean metric x 100, as eval.py averages it),
`categories[category][length]` (the mean of its tasks, as collect_results.py averages them), `counts`, `truncated` and
`mean_input_tokens[task][length]`; with NarrativeQA, `also` (its SubEM) and `note` (HELMET's GPT-4o judge is not
run). `Helmet` is the protocol (a unit is one row, (task, length, row); the models share
one folder); the runner writes settings.json, samples.jsonl, results.json and helmet.png (each category vs length).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.helmet_prepared import CATEGORIES as PREPARED
from tapecli.eval.helmet_prepared import Prepared
from tapecli.eval.protocol import Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "helmet.png"
SEED = 42  # HELMET's --seed default: the max_test_samples draw
ICL_LONGQA = ("Many-shot ICL (icl_trec_coarse, icl_trec_fine, icl_banking77, icl_clinic150, icl_nlu; configs/icl.yaml, "
              "load_icl): 500 test rows with balanced labels, per row its configs' count of label-balanced "
              "demonstrations and labels mapped to random integers (seeded by sha256(text) + 42), stopping at a new "
              "line, exact_match of the output parsed after 'label:'. Long-document QA (narrativeqa, infbench_qa_eng, "
              "infbench_choice_eng; configs/longqa.yaml, load_narrativeqa, load_infbench): documents kept by length "
              "and cut to length - 200 - generation_max_length Llama-2 tokens (truncate_llama2), `shots` "
              "demonstrations, no chat template (HELMET's base-model setting); infbench_qa_eng ROUGE-L F1, "
              "infbench_choice_eng exact_match (choice_post_process), narrativeqa ROUGE-L F1 and SubEM: HELMET's "
              "GPT-4o judge is not run")
PROTOCOL = ("HELMET (princeton-nlp/HELMET: data.py, model_utils.py, utils.py, configs/recall.yaml, rag.yaml, "
            "rerank.yaml): synthetic recall (json_kv, ruler_niah_mk_2, ruler_niah_mk_3, ruler_niah_mv), RAG (kilt_nq, "
            "kilt_triviaqa, kilt_hotpotqa, kilt_popqa with log10(s_pop) < 3) and re-ranking (msmarco_rerank_psg); "
            "rows drawn by Dataset.shuffle(seed=42) (RAG, re-ranking: random.sample of sorted keys after "
            "random.seed(42)), their demonstrations by the loaders' sha256-seeded shuffle; data.py's prompt "
            "templates, no chat template, json_kv with the row's first `shots` demos; default special tokens + "
            "prompt; a prompt longer than length - generation_max_length has its context cut at the end by the "
            "excess in tokens; greedy decoding up to generation_max_length, stopping at EOS (RAG, re-ranking: also "
            "at a new-line token); metrics: substring_exact_match (json_kv and RAG, max over the raw and parsed "
            "output), ruler_recall, NDCG@10 (parse_rankings, trec_eval through pytrec_eval); task score = mean x "
            "100; category = mean over its tasks. " + ICL_LONGQA + " Summarisation (infbench_sum_eng, multi_lexsum: "
            "load_infbench, load_multi_lexsum, documents of >= 65,536 tokens of the truncation tokenizer cut to "
            "length - 1,400 / "
            "- 700 as truncate_llama2 does): rougeLsum_f1 (calculate_metrics, rouge-score, max over raw and parsed "
            "output); HELMET's GPT-4o judge is not run. Citations (alce_asqa, alce_qampari: load_alce, 8-700 "
            "passages, demonstrations by random.sample after random.seed(42)): eval_alce.py's str_em / "
            "qampari_rec_top5 and, with an NLI model, citation_rec / citation_prec (at most 3 citations); the "
            "system template is put before each completion as eval.py does without a chat template")

Unit = tuple[str, int, int]  # (task, length, row index in its file; ICL and long QA: in the prepared rows)


@dataclass
class Helmet(Evaluation):
    """HELMET on one model or several, with `tape eval helmet`'s options (see the module docstring)."""

    name = "helmet"
    unit = "samples"
    plot_file = PLOT_FILE
    together = True
    data: str | None = None
    tasks: list[str] = field(default_factory=lambda: ["recall", "rag", "rerank"])
    lengths: list[int] = field(default_factory=lambda: [8192, 16384, 32768, 65536, 131072])
    samples: int | None = None  # None: each task's max_test_samples (100; ICL 500)
    shots: int = 2
    nli_model: str | None = None  # citations: the NLI model of citation recall/precision (None: not computed)
    truncation_tokenizer: str = "meta-llama/Llama-2-7b-hf"  # long-document QA, summarisation: data.py's truncate_llama2
    nli: Any = field(default=None, init=False, repr=False)
    rows: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)
    chosen: dict[tuple[str, int], list[int]] = field(default_factory=dict, init=False, repr=False)
    demos: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)
    read_files: list[str] = field(default_factory=list, init=False, repr=False)
    prepared: Any = field(default=None, init=False, repr=False)

    def check(self, models: list[str]) -> None:
        from tapecli.data import helmet
        from tapecli.eval import helmet_summ_cite

        names: list[str] = []
        for name in self.tasks:
            if name not in helmet.TASKS and name not in helmet.CATEGORIES:
                raise TapeError(f"--tasks: unknown task {name!r}; choose {', '.join(helmet.CATEGORIES)} or among "
                                f"{', '.join(helmet.TASKS)}")
            names += helmet.CATEGORIES.get(name, [name])
        self.tasks = list(dict.fromkeys(names))
        self.lengths = sorted(set(self.lengths))
        if not self.lengths or min(self.lengths) < 1:
            raise TapeError(f"--lengths: positive token counts, got {self.lengths}")
        if (self.samples is not None and self.samples < 1) or self.shots < 0:
            raise TapeError(f"--samples must be positive and --shots at least 0, got {self.samples}, {self.shots}")
        if self.samples is None and all(helmet.TASKS[t].samples == 100 for t in self.tasks):
            self.samples = 100  # as settings.json recorded it before ICL's 500
        self.prepared = Prepared(self.data, self.shots, self.truncation_tokenizer, shuffled)
        for task, length in itertools.product(self.tasks, self.lengths):
            definition = helmet.TASKS[task]
            if definition.category in PREPARED:  # ICL, long-document QA: rows made whole from HF datasets
                rows, described = self.prepared.rows(definition, length, self.samples or definition.samples)
                self.rows[task, length], self.chosen[task, length] = rows, list(range(len(rows)))
                self.read_files.append(described)
                continue
            if definition.category in helmet_summ_cite.CATEGORIES:
                continue  # their own files and draw: helmet_summ_cite.prepare below
            rows, described = helmet.read(self.data, definition, length)
            self.rows[task, length] = rows
            samples = self.samples or definition.samples
            self.chosen[task, length] = (draw(len(rows), samples) if definition.category == "recall"
                                         else draw_qa(definition, rows, samples))
            self.read_files.append(described)
            if definition.category != "recall":
                if (task, None) not in self.demos:
                    demos, described = helmet.read(self.data, definition, None)
                    popular = helmet.popular_enough if task == "kilt_popqa" else None
                    self.demos[task, None] = [d for d in demos if popular is None or popular(d)]
                    self.read_files.append(described)
                demos = self.demos[task, None]
                self.demos[task, length] = (helmet.rerank_pool(demos, [rows[i] for i in self.chosen[task, length]])
                                            if definition.category == "rerank" else demos)
        helmet_summ_cite.prepare(self, shuffled, draw)

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        from tapecli.data.helmet import CATEGORIES, HUB_ID
        from tapecli.eval import helmet_summ_cite

        data = {"path": str(Path(self.data).expanduser().resolve())} if self.data else {"hub": HUB_ID}
        cut = any(t in CATEGORIES["longqa"] + CATEGORIES["summ"] for t in self.tasks)
        return {"task": "helmet", "models": [source_of(m)[1] for m in models],
                "data": {**data, "files": self.read_files},
                "tasks": self.tasks, "lengths": self.lengths, "samples": self.samples, "shots": self.shots,
                **({"truncation_tokenizer": self.truncation_tokenizer} if cut else {}),
                "dtype": opening.dtype_name(), "pe_args": opening.pe_args, **helmet_summ_cite.settings(self)}

    def units(self, opened: OpenedModel) -> list[Unit]:
        return [(t, n, i) for t in self.tasks for n in self.lengths for i in self.chosen[t, n]]

    def key(self, row: dict[str, Any]) -> Unit:
        return row["task"], row["length"], row["row"]

    cell_fields = 2  # batches: `batch_size` rows of one (task, length) at a time

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        from tapecli.data import helmet
        from tapecli.eval import helmet_summ_cite
        from tapecli.eval.common import generate_batch
        from tapecli.eval.helmet_answer import scores
        from tapecli.eval.helmet_metric import ruler_recall, sub_em_score
        from tapecli.eval.helmet_rerank import ndcg_at_10, parse_rankings

        task = helmet.TASKS[units[0][0]]
        length = units[0][1]
        tokenizer = opened.tokenizer
        samples = []
        for _, _, i in units:
            row = self.rows[task.name, length][i]
            demos = []
            if task.category in PREPARED:
                samples.append(row)
                continue
            if task.category in ("rag", "rerank"):
                rows = self.rows[task.name, length]
                demos = helmet.demonstrations(task, row, self.demos[task.name, length], helmet.qa_key(rows, task),
                                              self.shots, shuffled)
            samples.append(helmet.fields(task, row, self.shots, demos))
        prompts = [tokenize(tokenizer, task, s, length) for s in samples]
        eos = getattr(tokenizer, "eos_id", None)
        stop = [eos] if eos is not None and eos >= 0 else None

        def new_line(new: list[int]) -> bool:  # HELMET's stop_new_line: a token that is one or two new lines
            return tokenizer.decode(new[-1:]) in ("\n", "\n\n")

        outputs = generate_batch(opened.model, [ids for ids, _ in prompts], task.generation_max_length,
                                 batch_size=len(units), stop_tokens=stop, pad_id=eos if stop else None,
                                 stop_check=new_line if task.stop_new_line else None)
        out = []
        for (_, _, index), sample, (ids, cut), output in zip(units, samples, prompts, outputs, strict=True):
            if stop and eos in output:
                output = output[: output.index(eos)]
            if task.stop_new_line:  # the tokens up to the first new-line token, it included
                ends = [k for k in range(len(output)) if new_line(output[: k + 1])]
                output = output[: ends[0] + 1] if ends else output
            text = tokenizer.decode(output)
            extra: dict[str, Any] = {}
            if task.category in PREPARED:
                extra = scores(task.name, text, sample["answer"])
                score = extra.pop(task.metric)
                extra.update({"document_cut": sample["document_cut"]} if "document_cut" in sample else {})
            elif task.category in helmet_summ_cite.CATEGORIES:
                extra = helmet_summ_cite.score(self, task, sample, text, opened.device)
                score = extra[task.metric]
            elif task.metric == "NDCG@10":
                labels = {c["id"]: int(c["label"]) for c in sample["ctxs"]}
                score = ndcg_at_10(parse_rankings(text), labels, sample["qid"])
            elif task.metric == "ruler_recall":
                score = ruler_recall(text, sample["answer"])
            else:
                score = sub_em_score(text, sample["answer"], "corresponding value:" if task.name == "json_kv"
                                     else "Answer:")
            out.append({"task": task.name, "length": length, "row": index, "input_tokens": len(ids),
                        "truncated": cut, "output": text, "answer": sample["answer"], task.metric: score, **extra})
        return out

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        from tapecli.eval.helmet_summ_cite import extend

        summary = extend(summarise(rows, self.tasks, self.lengths), rows, self.tasks, self.lengths, self.nli_model)
        return {**opened.record(), **summary}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "helmet", "protocol": PROTOCOL, "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        from tapecli.eval.long_context import plot_lines

        series = {f"{m['name']}, {c}": [(int(n), v) for n, v in cells.items()] for m in results["models"]
                  for c, cells in m["categories"].items()}
        plot_lines(series, path, xlabel="input length (tokens)", ylabel="score (x100)",
                   title="HELMET by category and input length")

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        from tapecli.eval.long_context import table

        lines = []
        for folder in results.values():
            for m in folder["models"]:
                columns = sorted({int(n) for cells in m["scores"].values() for n in cells})
                also = {f"{t} {k}": cells for t, metrics in m.get("also", {}).items() for k, cells in metrics.items()}
                lines += ["", f"{m['name']}: HELMET scores (x100; {m['truncated']} of {m['samples']} prompts cut)",
                          table({**m["scores"], **also, **m["categories"]}, columns, first="task / length"),
                          *m.get("notes", [])]
        return "\n".join(lines)


def shuffled(size: int, seed: int) -> list[int]:
    """`datasets.Dataset.shuffle(seed=seed)` of `size` rows, as the row indices in their new order."""
    import datasets

    return datasets.Dataset.from_dict({"i": list(range(size))}).shuffle(seed=seed)["i"]


def draw(size: int, samples: int) -> list[int]:
    """The rows HELMET evaluates with max_test_samples: `Dataset.shuffle(seed=42).select(range(min(samples,
    size)))`, as indices into the file (sorted)."""
    return sorted(shuffled(size, SEED)[: min(samples, size)])


def draw_qa(task: Any, rows: list[dict[str, Any]], samples: int) -> list[int]:
    """load_qa's (and load_msmarco_rerank's) draw after random.seed(42): PopQA's popularity filter, then
    `random.sample(sorted(keys), min(samples, len(keys)))` and every row whose key was drawn, as indices into the
    file."""
    import random

    from tapecli.data.helmet import popular_enough, qa_key

    key = qa_key(rows, task)
    kept = [i for i, r in enumerate(rows) if task.name != "kilt_popqa" or popular_enough(r)]
    keys = {rows[i][key] for i in kept}
    drawn = set(random.Random(SEED).sample(sorted(keys), min(samples, len(keys))))
    return [i for i in kept if rows[i][key] in drawn]


def tokenize(tokenizer: Any, task: Any, sample: dict[str, Any], max_length: int) -> tuple[list[int], bool]:
    """(prompt ids, whether the context was cut): model_utils.py's `tokenize` without a chat template."""
    from tapecli.data.helmet import prompt

    ids = tokenizer.encode(prompt(task, sample), add_special_tokens=True)
    budget = max_length - task.generation_max_length
    if len(ids) <= budget:
        return ids, False
    over = len(ids) - budget
    context = tokenizer.encode(sample["context"], add_special_tokens=False)
    cut = {**sample, "context": tokenizer.decode(context[:-over])}
    return tokenizer.encode(prompt(task, cut), add_special_tokens=True), True


def summarise(rows: list[dict[str, Any]], tasks: list[str], lengths: list[int]) -> dict[str, Any]:
    """Per task and length, the mean metric x 100 (eval.py), and each category's mean over its tasks per length."""
    from tapecli.data.helmet import CATEGORIES, TASKS
    from tapecli.eval.helmet_prepared import ALSO, NOTE

    def cell(t: str, n: int) -> list[dict[str, Any]]:
        return [r for r in rows if r["task"] == t and r["length"] == n]

    scores = {t: {str(n): round(100 * sum(r[TASKS[t].metric] for r in cell(t, n)) / len(cell(t, n)), 2)
                  for n in lengths if cell(t, n)} for t in tasks}
    categories: dict[str, dict[str, float]] = {}
    for category, members in CATEGORIES.items():
        for n in lengths:
            present = [scores[t][str(n)] for t in tasks if t in members and str(n) in scores[t]]
            if present:
                categories.setdefault(category, {})[str(n)] = round(sum(present) / len(present), 2)
    counts = {t: {str(n): len(cell(t, n)) for n in lengths if cell(t, n)} for t in tasks}
    tokens = {t: {str(n): round(sum(r["input_tokens"] for r in cell(t, n)) / len(cell(t, n)), 1)
                  for n in lengths if cell(t, n)} for t in tasks}
    also = {t: {m: {str(n): round(100 * sum(r[m] for r in cell(t, n)) / len(cell(t, n)), 2)
                    for n in lengths if cell(t, n)} for m in ALSO[t]} for t in tasks if t in ALSO}
    return {"scores": scores, "categories": categories, "counts": counts, "samples": len(rows),
            "truncated": sum(r["truncated"] for r in rows), "mean_input_tokens": tokens,
            **({"also": also, "notes": [NOTE]} if also else {})}
