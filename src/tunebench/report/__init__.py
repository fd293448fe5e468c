"""From records to what a person reads.

    format.py      one number formatter and one run label
    views.py       terminal tables of training results (bench.py: of hw, load, infer results)
    context.py     the records grouped and priced once; sections/ build the report from it
    render.py      sections as Markdown and self-contained HTML; build.py writes the report folder
    plots.py       PNG plots;  export.py  CSV, Parquet, JSON lines;  publish.py  one page per run
    cost.py, compare.py, consistency.py   analysis: prices, A/B comparison, node-to-node spread
"""
