"""The CLI's command handlers, one module per group; the parser lives in tunebench.cli."""
