"""The engine: ``LLMEngine`` (engine.py) steps scheduled batches through the ``ModelRunner``,
``Sampler`` and ``IncrementalDetokenizer``, taking requests through request_intake.py and reporting
through reports.py; ``LLM`` (llm.py) is the offline API on top. Outputs follow the contract in outputs.py."""
