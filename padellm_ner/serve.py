"""``padellm-ner serve``: run the API with uvicorn."""

from __future__ import annotations

import argparse
import os


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve :func:`padellm_ner.asgi.create_app` (settings from the environment; ``--model`` sets
    ``NER_MODEL``, checked before the server starts). uvicorn neither reads proxy headers (the app
    does, from ``NER_TRUSTED_PROXIES`` only) nor configures logging (the app logs JSON lines); its
    HTTP protocol times out slow clients' headers and bodies (:mod:`padellm_ner.slow_clients`)."""
    import uvicorn  # here, not at the top: every command builds this parser, only serve runs a server

    if args.model:
        from ner_service.engine.ner_model import resolve_ner_model

        resolve_ner_model(args.model)  # an unknown model is one clear error line, not a server that never gets ready
        os.environ["NER_MODEL"] = args.model
    uvicorn.run(
        "padellm_ner.asgi:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        proxy_headers=False, log_config=None, access_log=False, http="padellm_ner.slow_clients:TimedH11Protocol",
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` sub-command."""
    serve = subparsers.add_parser("serve", help="serve the REST API, the metrics and the highlighting page")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model", default=None, help="the default model: a shipped name or a folder with ner_model.json, "
                                                     "e.g. one written by padellm-ner train (default: NER_MODEL, else en-conll03)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (each loads the model and batches on its own)")
    serve.set_defaults(func=cmd_serve)
