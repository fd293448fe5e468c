"""Training data from local files: read (files.py), tokenized into examples (examples.py) with the tokenizer
(tokenizer.py), laid into seq_len rows (rows.py), cached on disk (prepare.py), and served to the loop
batch by batch, resumably (batches.py). Nothing is downloaded: `datasets` reads local files only."""
