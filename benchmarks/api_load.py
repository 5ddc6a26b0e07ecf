"""The REST API under load: micro-batching on against one request at a time, in one run.

Starts the real server (uvicorn on a loopback port) twice on the same model, once with
``NER_MICROBATCH=0`` (the baseline: each request is its own engine call) and once with
``NER_MICROBATCH=1``; each time, ``--clients`` closed-loop clients post one CoNLL-03 dev
sentence per request to ``/v1/entities`` for ``--seconds``. Reported per mode: throughput
(requests answered 200 within the window, per second, after ``--warmup`` seconds of the same
load), p50/p99 latency of those answers, requests refused with 429 or 503 and ``Retry-After``
(admission's answer to more work than fits), errors (any other answer or a failed connection
within the window) and the mean engine batch size in the window, read from ``/metrics``.

Usage: python benchmarks/api_load.py [--seconds S] [--clients C] [--model NAME] [--json PATH]
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, write_json  # noqa: E402
from tests.local_services import live_server  # noqa: E402
from corpora import read_corpus  # noqa: E402

MODES = (False, True)  # micro-batching off (baseline), on


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def batch_totals(url: str) -> tuple[float, float]:
    """Texts and engine calls of the server at ``url`` so far, from ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    total = float(re.search(r"^padellm_engine_batch_texts_sum (\S+)$", text, re.M).group(1))
    calls = float(re.search(r"^padellm_engine_batch_texts_count (\S+)$", text, re.M).group(1))
    return total, calls


@dataclass
class Load:
    """What the clients saw: answers that arrived inside the measured window."""

    latencies_ms: list[float] = field(default_factory=list)
    refused: int = 0  # 429 or 503 with Retry-After: the server shedding load, as it should
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def drive(url: str, texts: list[str], clients: int, warmup: float, seconds: float, model: str,
          on_window_start: Callable[[], None] = lambda: None) -> Load:
    """``clients`` threads, each posting the next text as soon as its previous answer came, without pause
    for ``warmup + seconds``; counted are the answers that arrive in the last ``seconds`` (whenever sent).

    Returns at the end of the window: requests still in flight are left to the server's shutdown."""
    load = Load()
    window_start = time.perf_counter() + warmup
    window_end = window_start + seconds

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=None) as http:
            at = index
            while time.perf_counter() < window_end:
                began = time.perf_counter()
                try:
                    response = http.post("/v1/entities", json={"text": texts[at % len(texts)], "model": model})
                    status = response.status_code if response.status_code == 200 or "Retry-After" in response.headers else -1
                except httpx.HTTPError:
                    status = -1
                done = time.perf_counter()
                at += clients
                if window_start <= done <= window_end:
                    with load.lock:
                        if status == 200:
                            load.latencies_ms.append((done - began) * 1000)
                        elif status in (429, 503):
                            load.refused += 1
                        else:
                            load.errors += 1

    for index in range(clients):
        threading.Thread(target=client, args=(index,), daemon=True).start()
    time.sleep(max(0.0, window_start - time.perf_counter()))
    on_window_start()
    time.sleep(max(0.0, window_end - time.perf_counter()))
    with load.lock:
        return Load(list(load.latencies_ms), load.refused, load.errors)


def main() -> None:
    parser = benchmark_parser(__doc__, "api_load", limit=500, limit_help="dev sentences the clients cycle through")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per mode (default %(default)s)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds of unmeasured load before each window; at least one round of all clients (default %(default)s)")
    parser.add_argument("--torch-threads", type=int, help="OMP_NUM_THREADS of both servers (default: torch's, one per core)")
    parser.add_argument("--batch-wait-ms", type=float, help="NER_BATCH_WAIT_MS of the micro-batched server (default: the setting's)")
    parser.add_argument("--batch-max-texts", type=int, help="NER_BATCH_MAX_TEXTS of the micro-batched server (default: the setting's)")
    args = parser.parse_args()

    texts = [e.text for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    json_path = Path(args.json)
    rows = []
    for microbatch in MODES:
        env = {"NER_MODEL": args.model, "NER_MICROBATCH": "1" if microbatch else "0", "NER_API_KEYS": "",
               "NER_RATE_LIMIT_PER_MINUTE": "100000000", "NER_REQUEST_TIMEOUT_S": "600",
               "NER_QUEUE_MAX": str(max(256, 4 * args.clients)), "LOG_LEVEL": "WARNING"}
        if args.torch_threads is not None:
            env["OMP_NUM_THREADS"] = str(args.torch_threads)
        if microbatch and args.batch_wait_ms is not None:
            env["NER_BATCH_WAIT_MS"] = str(args.batch_wait_ms)
        if microbatch and args.batch_max_texts is not None:
            env["NER_BATCH_MAX_TEXTS"] = str(args.batch_max_texts)
        log = json_path.with_name(f"{json_path.stem}_server_{'on' if microbatch else 'off'}.log")
        with live_server(env, log, ready_timeout_s=600) as url:
            before: list[tuple[float, float]] = []
            load = drive(url, texts, args.clients, args.warmup, args.seconds, args.model,
                         on_window_start=lambda before=before, url=url: before.append(batch_totals(url)))
            (texts_before, calls_before), (texts_after, calls_after) = before[0], batch_totals(url)
            calls = calls_after - calls_before
            batch = (texts_after - texts_before) / calls if calls else float("nan")
        rows.append({
            "microbatch": microbatch,
            "clients": args.clients,
            "throughput_rps": len(load.latencies_ms) / args.seconds,
            "p50_ms": percentile(load.latencies_ms, 0.5),
            "p99_ms": percentile(load.latencies_ms, 0.99),
            "p99_over_p50": percentile(load.latencies_ms, 0.99) / percentile(load.latencies_ms, 0.5) if load.latencies_ms else float("nan"),
            "refused": load.refused,
            "errors": load.errors,
            "answered": len(load.latencies_ms),
            "mean_batch_texts": batch,
            "mean_ms": statistics.fmean(load.latencies_ms) if load.latencies_ms else float("nan"),
        })
    speedup = rows[1]["throughput_rps"] / rows[0]["throughput_rps"] if rows[0]["throughput_rps"] else float("nan")
    print(f"\n{args.model}, {args.clients} clients, {args.seconds:g} s per mode, {len(texts)} CoNLL-03 dev sentences, "
          f"{os.cpu_count()} CPUs; throughput with micro-batching {speedup:.2f}x")
    print_table(rows, ["microbatch", "clients", "throughput_rps", "p50_ms", "p99_ms", "p99_over_p50", "refused", "errors", "answered", "mean_batch_texts"])
    path = write_json(json_path, {"benchmark": "api_load", "model": args.model, "clients": args.clients, "seconds": args.seconds,
                                  "warmup": args.warmup, "torch_threads": args.torch_threads,
                                  "batch_wait_ms": args.batch_wait_ms, "batch_max_texts": args.batch_max_texts,
                                  "results": rows, "speedup": speedup})
    png = bar_plots(path.with_suffix(".png"), ["one at a time", "micro-batched"], {
        "throughput (requests/s)": [r["throughput_rps"] for r in rows],
        "p50 latency (ms)": [r["p50_ms"] for r in rows],
        "p99 latency (ms)": [r["p99_ms"] for r in rows],
    }, f"API under load, {args.model}, {args.clients} clients: micro-batching {speedup:.2f}x throughput")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
