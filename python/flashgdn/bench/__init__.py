"""flashgdn's side-by-side benchmark (DESIGN §5): flashgdn beside FLA, FlashQLA and FlashInfer.

    python -m flashgdn.bench --quick            # a subset of the forward and backward tables
    python -m flashgdn.bench                    # the full tables (171 forward, 32 x 2 backward rows)
    python -m flashgdn.bench.summary CSV...     # markdown summary into bench/README.md

Modules: configs (the tables, filters), floors (memory and tensor-core floors), results (CSV
schema, best anchor, speedup), report (printed table, progress), summary (bench/README.md), plots
(PNG, matplotlib optional) are torch-free; inputs, oracle, timing, anchors, runner and cli's run()
need torch and a GPU.
"""
