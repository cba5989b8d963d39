"""`python -m tapecli.lm_eval_cli ...`: lm-eval's own command line, with tape's model registered as `tape`.

lm-eval has no plugin discovery (its `--model` knows only built-in names and classes imported before it runs), so
this module imports the adapter and then hands over to lm-eval's CLI. Example:

    python -m tapecli.lm_eval_cli --model tape --model_args pretrained=runs/c4-tape,batch_size=8 \\
        --include_path my_tasks/ --tasks my_task --output_path out/
"""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import tapecli.eval.lm_adapter  # noqa: F401  (registers the `tape` model)

    cli_evaluate()


if __name__ == "__main__":
    main()
