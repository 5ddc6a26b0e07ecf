"""``padellm-ner serve``: run the API with uvicorn."""

from __future__ import annotations

import argparse

import uvicorn


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve :func:`padellm_ner.asgi.create_app` (settings from the environment)."""
    uvicorn.run(
        "padellm_ner.asgi:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        proxy_headers=True, forwarded_allow_ips=args.forwarded_allow_ips, access_log=False,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` sub-command."""
    serve = subparsers.add_parser("serve", help="serve the REST API, the metrics and the highlighting page")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="worker processes (each loads the model and batches on its own)")
    serve.add_argument("--forwarded-allow-ips", default="127.0.0.1", help="proxies whose X-Forwarded-For is trusted (client IPs for the dev-mode rate limit)")
    serve.set_defaults(func=cmd_serve)
