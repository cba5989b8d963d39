"""Training: the loop (`engine`), optimizer and schedules (`optim`), data parallelism (`distributed`) and the
progress display (`progress`). Entry points: `tapecli.train.engine.pretrain` and `finetune`."""
