"""A native lm-evaluation-harness model over tape's model core, registered in lm-eval as `tape`.

Contract (lm-eval's `TemplateLM`, see docs/contracts.md):
    TapeLM(pretrained="runs/x" | checkpoint dir | HF dir or id, dtype="auto", device="auto", batch_size=1,
           max_length=None, max_gen_toks=256, add_bos_token=True, seed=1234, pe_args=None)
    TapeLM.from_opened(opened, **same options)               # a model opened by tapecli.store.door.open_model
    lm.loglikelihood(requests) -> [(logprob, is_greedy)]     # via TemplateLM's pair encoding + _loglikelihood_tokens
    lm.loglikelihood_rolling(requests) -> [logprob]          # disjoint max_length windows, as lm-eval's HF model
    lm.generate_until(requests) -> [str]                     # stop strings, max_gen_toks, greedy or seeded sampling

Every request is scored the way lm-eval's own `hf` model (`HFLM`) scores it, so that a Hugging Face Llama imported
into tape gives the same per-sample numbers as `HFLM` on the same directory (tests/test_harness.py checks it):
  - tokens: the model's own tokenizer; BOS is prepended to every encoded string unless `add_bos_token=False`
    (Llama tokenizers do the same under HFLM, and tape's pre-training starts every document with BOS); the
    prefix token for empty contexts and rolling windows is BOS, the end-of-text token is EOS;
  - loglikelihood: requests sorted longest first and grouped by context with lm-eval's `Collator`; context +
    continuation truncated from the left to max_length + 1 tokens; right-padded batches (exact under causal
    attention: a position's logits depend only on the tokens up to it, for every tape PE); `is_greedy` is whether
    the argmax at every continuation position equals the continuation;
  - loglikelihood_rolling: `lm_eval.utils.get_rolling_token_windows` + `make_disjoint_window` with context_len=1;
  - generate_until: `normalize_gen_kwargs` (default max_gen_toks 256), prompts left-truncated to
    max_length - max_gen_toks, a row stops at EOS or once its text holds a stop string, text cut at the first
    stop string (`postprocess_generated_text`).
  - generation batches: longest first (lm-eval's `Collator`, grouped by generation settings), left-padded and
    masked by `tapecli.eval.common.generate_batch`, KV cache; sampling draws from one generator seeded with
    `seed` + the batch's index, so a command repeated gives the same samples (another batch size gives others).
Padding and generation go through the two small functions `_forward_padded` and `_generate`, the only places that
know how tape batches sequences of different lengths.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from tapecli.errors import TapeError
from tapecli.eval.common import generate_batch

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from tapecli.store.door import OpenedModel

# The lm-eval versions this adapter is written and tested against; pyproject.toml states the same range (a test checks).
LM_EVAL_RANGE = ">=0.4.10,<0.5"


def check_lm_eval_version(installed: str | None = None) -> str:
    """The installed lm-eval version, or a TapeError naming the supported range when it is outside it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if installed is None:
        try:
            installed = version("lm_eval")
        except PackageNotFoundError:
            raise TapeError(f"lm-eval is not installed; pip install 'lm-eval{LM_EVAL_RANGE}'") from None
    try:
        supported = Version(installed) in SpecifierSet(LM_EVAL_RANGE, prereleases=True)
    except InvalidVersion:
        supported = False
    if not supported:
        raise TapeError(f"lm-eval {installed} is not supported; tape's harness model needs lm-eval{LM_EVAL_RANGE} "
                        f"(pip install 'lm-eval{LM_EVAL_RANGE}')")
    return installed


def _int_option(name: str, value: Any) -> int:
    """lm-eval's CLI hands model arguments over as strings (`batch_size=8`): accept ints and digit strings."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise TapeError(f"{name}={value!r}: expected a positive integer") from None
    if number <= 0:
        raise TapeError(f"{name}={value!r}: expected a positive integer")
    return number


def _bool_option(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise TapeError(f"{name}={value!r}: expected true or false")


@register_model("tape")
class TapeLM(TemplateLM):
    """lm-eval's view of a tape model: loglikelihood, rolling loglikelihood and generation (see module docstring)."""

    def __init__(self, pretrained: str | None = None, dtype: str = "auto", device: str | None = "auto",
                 batch_size: int | str = 1, max_batch_size: int | None = None, max_length: int | str | None = None,
                 max_gen_toks: int | str = 256, add_bos_token: bool | str = True, seed: int | str = 1234,
                 pe_args: dict[str, Any] | str | None = None, opened: OpenedModel | None = None,
                 **unused: Any) -> None:
        super().__init__()
        check_lm_eval_version()
        if unused:
            raise TapeError(f"unknown tape model argument(s) {', '.join(sorted(unused))}; allowed: pretrained, "
                            "dtype, device, batch_size, max_length, max_gen_toks, add_bos_token, seed, pe_args")
        if str(batch_size) == "auto" or str(batch_size).startswith("auto:"):
            raise TapeError("batch_size=auto is not supported by the tape model; pass a number, e.g. batch_size=8")
        if opened is None:
            if not pretrained:
                raise TapeError("the tape model needs pretrained=RUN (a tape run, checkpoint, or Hugging Face "
                                "directory or id)")
            from tapecli.eval.common import parse_pe_args
            from tapecli.store.door import open_model

            if isinstance(pe_args, str):  # from lm-eval's CLI: pe_args=scaling=linear;factor=2
                pe_args = parse_pe_args([pair for pair in pe_args.split(";") if pair])
            opened = open_model(str(pretrained), dtype=dtype or "auto", device=device or "auto", pe_args=pe_args)
        self.opened = opened
        self.model, self.tok = opened.model, opened.tokenizer
        self._device = next(self.model.parameters()).device
        self._batch_size = _int_option("batch_size", batch_size)
        self._max_length = _int_option("max_length", max_length) if max_length else self.model.config.max_seq_len
        self._max_gen_toks = _int_option("max_gen_toks", max_gen_toks)
        self.add_bos_token = _bool_option("add_bos_token", add_bos_token)
        self.seed = int(seed)

    @classmethod
    def from_opened(cls, opened: OpenedModel, **options: Any) -> TapeLM:
        """Wrap a model already opened with `tapecli.store.door.open_model`."""
        return cls(opened=opened, **options)

    # --- what lm-eval asks of every model -----------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return type(self.tok).__name__

    def settings(self) -> dict[str, Any]:
        """What determines this model's answers (recorded under `config` in lm-eval's results)."""
        return {**self.opened.record(), "max_length": self.max_length, "max_gen_toks": self.max_gen_toks,
                "add_bos_token": self.add_bos_token, "seed": self.seed}

    def get_model_info(self) -> dict[str, Any]:
        return self.settings()

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        ids = self.tok.encode(string)
        add_bos = self.add_bos_token if add_special_tokens is None else add_special_tokens
        if add_bos and not (ids and ids[0] == self.tok.bos_id):  # a string that already starts with BOS keeps one
            ids = [self.tok.bos_id, *ids]
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    # --- loglikelihood ------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool]] = []
        # Longest first (OOMs show up at once, the first batch fixes the padded length); requests that share
        # context + continuation[:-1] run once (multiple choice with one-token answers).
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
                         group_by="contexts", group_fn=lambda r: r[-2] + r[-1][:-1])
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="Running loglikelihood requests")
        for chunk in order.get_batched(n=self.batch_size):
            inputs = []
            for _, context, continuation in chunk:
                if not context or not continuation or len(continuation) > self.max_length:
                    raise TapeError(f"cannot score a continuation of {len(continuation)} tokens after "
                                    f"{len(context)} context tokens with max_length={self.max_length}")
                # The last continuation token is only predicted, never fed in.
                inputs.append((context + continuation)[-(self.max_length + 1):][:-1])
            logprobs = F.log_softmax(self._forward_padded(inputs), dim=-1, dtype=torch.float32)
            for (request, context, continuation), row, tokens in zip(chunk, logprobs, inputs, strict=True):
                scored = row[len(tokens) - len(continuation):len(tokens)].unsqueeze(0)  # [1, cont, vocab]
                greedy = scored.argmax(dim=-1)
                for request_str, cont, lp in order.get_cache(req_str=request, cxt_toks=context,
                                                             cont_toks=continuation, logits=scored):
                    target = torch.tensor(cont, dtype=torch.long, device=lp.device).unsqueeze(0)
                    is_greedy = bool((greedy[:, -target.shape[1]:] == target).all())
                    answer = (float(lp.gather(2, target.unsqueeze(-1)).sum()), is_greedy)
                    results.append(answer)
                    if request_str is not None:  # rolling windows are cached per document instead
                        self.cache_hook.add_partial("loglikelihood", request_str, answer)
                    progress.update(1)
        progress.close()
        return order.get_original(results)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, request in enumerate(requests):
            tokens = self.tok_encode(request.args[0])
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, context, continuation))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owners, scores, strict=True):
            totals[index] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # --- generation ---------------------------------------------------------------------------------------------

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        results: list[str] = []
        order = Collator([r.args for r in requests], sort_fn=lambda a: (-len(self.tok_encode(a[0])), a[0]),
                         group_by="gen_kwargs", group_fn=lambda a: a[1])
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="Running generate_until requests")
        for batch_index, chunk in enumerate(order.get_batched(n=self.batch_size)):
            contexts, all_kwargs = zip(*chunk, strict=True)
            kwargs = normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks)  # one group shares its kwargs
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = kwargs.pop("max_gen_toks")
            if max_new >= self.max_length:
                raise TapeError(f"max_gen_toks={max_new} leaves no room for a prompt with max_length="
                                f"{self.max_length}")
            prompts = [self.tok_encode(c, left_truncate_len=self.max_length - max_new) for c in contexts]
            # Greedy unless do_sample; sampling without a temperature uses 1.0 (transformers' default).
            temperature = float(kwargs.get("temperature") or 1.0) if kwargs.get("do_sample") else 0.0
            outputs = self._generate(prompts, max_new, until, temperature=temperature, top_k=kwargs.get("top_k"),
                                     top_p=kwargs.get("top_p"), seed=self.seed + batch_index)
            for context, gen_kwargs, tokens in zip(contexts, all_kwargs, outputs, strict=True):
                text = postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=None)
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                progress.update(1)
        progress.close()
        return order.get_original(results)

    # --- the model calls ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def _forward_padded(self, sequences: list[list[int]]) -> torch.Tensor:
        """Logits [B, T, V] for right-padded sequences. Under causal attention the logits at a position depend only
        on the tokens up to it, so the padding after a sequence never changes its scores."""
        if not self.model.config.causal:
            raise TapeError("the tape harness model needs a causal model (model.causal=true)")
        longest = max(len(s) for s in sequences)
        padded = torch.tensor([s + [self.tok.pad_id] * (longest - len(s)) for s in sequences], dtype=torch.long,
                              device=self.device)
        return self.model(padded)

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, until: list[str], temperature: float,
                  top_k: int | None, top_p: float | None, seed: int) -> list[list[int]]:
        """The new tokens for each prompt, EOS and what follows it removed. A row stops at EOS or as soon as its
        text holds a stop string (what follows is cut off anyway), so short answers cost few decoding steps."""
        eos = self.tok.eos_id
        stops = [s for s in until if s]
        outputs = generate_batch(self.model, prompts, max_new_tokens, batch_size=self.batch_size, stop_tokens=[eos],
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                 stop_check=(lambda new: any(s in self.tok_decode(new) for s in stops)) if stops
                                 else None)
        return [row[:row.index(eos)] if eos in row else row for row in outputs]
