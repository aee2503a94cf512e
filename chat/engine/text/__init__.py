"""The chat as the model's text, shared by local/ and remote/ (and the web tier): no torch.

The chat template rendered and tokenized so typed control tokens stay text (`template`), a model
folder's tokenizer read without transformers (`file_tokenizer`), stop strings held back so they
are never shown (`holdback`), and whether the model stops where its template ends a turn (`eos`).
"""
