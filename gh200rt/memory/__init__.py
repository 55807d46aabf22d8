"""Device-memory ledger (ledger.py): the one account of what sits in device memory."""
