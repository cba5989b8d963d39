"""Hugging Face interop: tape's model read from, and written as, a Hugging Face model directory.

    load.py     config.json -> ModelConfig, weights assigned from the safetensors, the tokenizer (importing a model)
    arch.py     the architectures tape imports and exports, and each one's layer layout (windows, NoPE, biases)
    files.py    the one place a Hugging Face directory's files are read (each fault one line naming the file)
    export.py   a tape model written as a Hugging Face directory (`tape export`)
    hub.py      hub ids and short names: what names a Hugging Face source, and its local directory

Which model a command opens is decided by `tapecli.store.door`, the one door every model is opened through; these
modules are its Hugging Face half. A new Hugging Face family goes in arch.py (its layout) and load.py (its keys).
Nothing is imported here, so that `import tapecli.model.hf.files` stays light.
"""
