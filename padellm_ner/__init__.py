"""The assembled service: the command line and the ASGI app that mount the engine's API and the
batch pipeline's routes. The only package that imports both ``ner_service`` and ``pipeline``."""
