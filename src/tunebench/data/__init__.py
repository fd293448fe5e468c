"""Training data from local files: read with every row checked (files.py, validate.py, dataset.py: a damaged row is
counted by reason, never trained as text), tokenized into examples (examples.py; chat through its template and
masked as transformers masks it, chat.py) with the tokenizer (tokenizer.py), laid into seq_len rows (rows.py),
cached on disk (prepare.py), and served to the loop batch by batch, resumably (batches.py). Nothing is downloaded."""
