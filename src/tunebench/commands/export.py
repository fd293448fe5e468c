"""`tunebench export`: parse, call tunebench.export, print."""

from __future__ import annotations

import argparse
import json


def cmd_export(args: argparse.Namespace) -> int:
    from tunebench.console import say
    from tunebench.errors import require

    require("gguf", "export --format gguf", "pip install gguf")
    from tunebench.export import export_gguf

    done = export_gguf(args.source, args.output, args.quant, progress=say, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(done, indent=2, default=str), file=args.stdout)
    else:
        print(f"{done['path']}: {done['arch']} ({done['architecture']}), {done['quant']}, {done['tensors']} tensors, "
              f"{done['bytes'] / 2**20:,.1f} MiB, from {done['source']}", file=args.stdout)
    return 0
