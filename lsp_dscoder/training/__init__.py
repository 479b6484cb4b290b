"""How the bundled model is made, step by step (each step a module runnable with `python -m`):

1. `corpus`: collect permissively licensed Python source on this machine, filter, split off held-out files.
2. `tokenizer`: train the byte-level BPE tokenizer (DeepSeek-Coder special tokens) on the training split.
3. `train`: train the LlamaForCausalLM on one GPU with document-level FIM, save bf16 shards.

`fim` holds the document format shared by training and evaluation; `checkpoint` the model shape and the
DeepSeek-Coder-style checkpoint writing.
"""
