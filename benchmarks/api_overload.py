"""The REST API beyond its capacity: admission control (429 + Retry-After) against none, in one run.

Starts the real server (uvicorn on a loopback port) and measures its capacity first: closed-loop
clients posting requests of ``--texts`` CoNLL-03 dev sentences for ``--seconds`` (requests
answered per second). Then, for each mode (admission on, as shipped; admission off, the
baseline: ``NER_ADMISSION_FRACTION`` so large that every request is queued) and each offered
load from 0.5x to 4x that capacity, an open-loop client sends requests at that rate for
``--seconds`` (arrivals do not wait for answers, as a crowd of users does not). Reported per
load: goodput (answers 200 per second), the share of 429s, the p99 latency of the requests
answered 200, and the 5xx count (504s when the queue outgrows the timeout; with admission it
must be 0).

Usage: python benchmarks/api_overload.py [--limit N] [--seconds S] [--timeout S] [--loads 0.5,1,2,4] [--json PATH]
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.api_load import percentile  # noqa: E402
from benchmarks.reporting import benchmark_parser, fail, print_table, save_figure, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from tests.local_services import live_server  # noqa: E402

LOADS = (0.5, 1.0, 2.0, 4.0)
MODES = {"admission": "0.8", "no admission": "1000000"}  # NER_ADMISSION_FRACTION


@dataclass
class Answers:
    """Status codes and latencies of the requests of one load level."""

    codes: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, code: int, seconds: float) -> None:
        with self.lock:
            self.codes.append(code)
            self.latencies_s.append(seconds)


def capacity(url: str, bodies: list[dict], seconds: float, clients: int = 8, patience: float = 60.0) -> float:
    """Requests answered 200 per second by closed-loop clients, over ``seconds`` or, on a server
    slower than that, until the first answer (at most ``patience`` seconds more)."""
    answered, end = [0], time.perf_counter() + seconds
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=None) as http:
            at = index
            while time.perf_counter() < end or (not answered[0] and time.perf_counter() < end + patience):
                if http.post("/v1/entities", json=bodies[at % len(bodies)]).status_code == 200:
                    with lock:
                        answered[0] += 1
                at += clients

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return answered[0] / (time.perf_counter() - began)


def drain(url: str, body: dict, timeout: float) -> None:
    """Wait until the server has worked off what a load level left queued (answers that timed out
    leave their work behind): until a request of one body is answered 200, which the queue serves
    after all that came before it; at most the request timeout and half a minute."""
    end = time.perf_counter() + timeout + 30
    with httpx.Client(base_url=url, timeout=timeout + 30) as http:
        while time.perf_counter() < end:
            if http.post("/v1/entities", json=body).status_code == 200:
                return
            time.sleep(0.2)


def offer(url: str, bodies: list[dict], rate: float, seconds: float, timeout: float) -> Answers:
    """Send requests at ``rate`` per second for ``seconds`` without waiting for answers."""
    answers = Answers()
    local = threading.local()

    def send(index: int) -> None:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=url, timeout=timeout + 30)
        began = time.perf_counter()
        try:
            code = local.http.post("/v1/entities", json=bodies[index % len(bodies)]).status_code
        except httpx.HTTPError:
            code = 599  # no answer at all counts as a server failure
        answers.add(code, time.perf_counter() - began)

    total = max(1, int(rate * seconds))  # every load level offers at least one request
    began = time.perf_counter()
    with ThreadPoolExecutor(256) as pool:
        for index in range(total):
            delay = began + index / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, index)
    return answers


def main() -> None:
    parser = benchmark_parser(__doc__, "api_overload", limit=64)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per load level (and for the capacity)")
    parser.add_argument("--timeout", type=float, default=10.0, help="NER_REQUEST_TIMEOUT_S of the server")
    parser.add_argument("--texts", type=int, default=4, help="sentences per request")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)), help="offered loads, as multiples of the measured capacity")
    args = parser.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    sentences = [e.text for e in read_corpus(args.data)[: args.limit]]
    bodies = [{"texts": sentences[i:i + args.texts], "model": args.model} for i in range(0, len(sentences) - args.texts + 1, args.texts)]
    rows = []
    folder = Path(args.json).parent
    for mode, fraction in MODES.items():
        env = {"NER_MODEL": args.model, "NER_API_KEYS": "", "NER_RATE_LIMIT_PER_MINUTE": "10000000", "NER_QUEUE_MAX": "100000",
               "NER_REQUEST_TIMEOUT_S": str(args.timeout), "NER_ADMISSION_FRACTION": fraction,
               "DATABASE_URL": f"sqlite:///{folder / 'api_overload.db'}", "OMP_NUM_THREADS": "2"}
        with live_server(env, folder / "api_overload_uvicorn.log") as url:
            capacity(url, bodies, min(5.0, args.seconds))  # warm up: the rate is measured
            measured = capacity(url, bodies, args.seconds)
            if not measured:
                fail("api_overload", f"the server ({mode}) answered no request with 200; see {folder / 'api_overload_uvicorn.log'}")
            print(f"{mode}: capacity {measured:.2f} requests/s of {args.texts} texts", flush=True)
            for load in loads:
                answers = offer(url, bodies, load * measured, args.seconds, args.timeout)
                ok = [s for c, s in zip(answers.codes, answers.latencies_s) if c == 200]
                rows.append({
                    "mode": mode, "load": load, "offered_per_s": load * measured, "capacity_per_s": measured,
                    "goodput_per_s": len(ok) / args.seconds, "share_429": answers.codes.count(429) / max(1, len(answers.codes)),
                    "p99_admitted_ms": percentile(ok, 0.99) * 1000, "errors_5xx": sum(c >= 500 for c in answers.codes),
                    "requests": len(answers.codes),
                })
                print_table([rows[-1]], list(rows[-1]))
                drain(url, bodies[0], args.timeout)  # the next level starts on an idle server
    print()
    print_table(rows, ["mode", "load", "offered_per_s", "goodput_per_s", "share_429", "p99_admitted_ms", "errors_5xx", "requests"])
    write_json(args.json, {"benchmark": "api_overload", "model": args.model, "timeout_s": args.timeout, "texts_per_request": args.texts,
                           "rows": rows})
    plot(Path(args.json).with_suffix(".png"), rows)
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")


def plot(path: Path, rows: list[dict]) -> None:
    """Goodput, 429 share, p99 of admitted requests and 5xx count against offered load, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("goodput_per_s", "goodput (200/s)"), ("share_429", "share of 429"), ("p99_admitted_ms", "p99 of 200s (ms)"),
              ("errors_5xx", "5xx answers"))
    figure, axes = plt.subplots(1, len(panels), figsize=(16, 3.6))
    for axis, (key, title) in zip(axes, panels):
        for mode in MODES:
            mine = [r for r in rows if r["mode"] == mode]
            axis.plot([r["load"] for r in mine], [r[key] for r in mine], marker="o", label=mode)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("offered load (x capacity)")
    axes[0].legend(fontsize=8)
    save_figure(figure, path)


if __name__ == "__main__":
    main()
