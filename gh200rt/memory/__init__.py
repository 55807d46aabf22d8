"""Device-memory ledger (ledger.py); host slabs, staging ring and placement follow."""
