"""Device memory: the ledger (ledger.py), the one account of what sits there, and zeroed buffers whose pages cost
nothing until used (zeroed.py)."""
